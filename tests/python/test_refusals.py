"""What gradscope refuses, where it takes another process to show it (docs/cli.md, "What
gradscope refuses"; the in-process classes are tests/refusals_test.cpp).

1. --import of a module that calls sys.exit(0) or sys.exit(3), raises KeyboardInterrupt or
   any exception at import: exit 2 naming the module and the exception, through
   `python -m gradscope`; gradscope.check(imports=[...]) raises GradscopeInputError and the
   process goes on.
2. --ops-library with gradscope's own operators (the namespace registered twice): exit 2
   naming the library and the namespace, through `python -m gradscope` too.
3. `gradscope run ... --dump d.h5 | head -c 10`: the reader goes away (SIGPIPE); no temporary
   is left next to d.h5.
4. `sample --cases-out DIR` when writing fails (a file-size limit of 0, as a full disk): exit
   2 and neither DIR nor a temporary folder beside it.
5. A compressed dataset that decodes to more than the memory the process may use (ulimit -v):
   exit 2 naming the file and the dataset.
"""
import os
import resource
import subprocess
import sys

import pytest

import gradscope


def run(cmd, **kw):
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120, **kw)
    return p.returncode, p.stdout + p.stderr


def test_import_guard(tmp_path, lora_w, monkeypatch):
    tmp = str(tmp_path)
    bodies = {
        "exits_zero": "import sys\nsys.exit(0)\n",
        "exits_three": "import sys\nsys.exit(3)\n",
        "interrupted": "raise KeyboardInterrupt\n",
        "raises": "raise ValueError('no GPU here')\n",
    }
    expected = {
        "exits_zero": "SystemExit(0)",
        "exits_three": "SystemExit(3)",
        "interrupted": "KeyboardInterrupt",
        "raises": "ValueError: no GPU here",
    }
    for name, body in bodies.items():
        with open(os.path.join(tmp, name + ".py"), "w") as f:
            f.write(body)
    env = dict(os.environ, PYTHONPATH=tmp + os.pathsep + os.environ.get("PYTHONPATH", ""))
    for name in bodies:
        code, out = run([sys.executable, "-m", "gradscope", "run", lora_w, "--impl", "x",
                         "--import", name], env=env)
        assert code == 2, (name, code, out)
        assert f"--import {name}: {expected[name]}" in out, (name, out)
    monkeypatch.syspath_prepend(tmp)
    for name in bodies:
        with pytest.raises(gradscope.GradscopeInputError) as e:
            gradscope.check(lora_w, impl="x", imports=[name])
        assert f"--import {name}: {expected[name]}" in str(e.value), (name, str(e.value))


def test_import_needs_python(gradscope_bin, lora_w):
    """The C++ program cannot import a Python module: it says which command can."""
    code, out = run([gradscope_bin, "run", lora_w, "--impl", "x", "--import", "mymod"])
    assert code == 2, (code, out)
    assert "--import mymod: importing a Python module needs the Python package: " \
        "python3 -m gradscope run ... --import mymod" in out, out


def test_namespace_twice(ops_library, lora_w):
    code, out = run([sys.executable, "-m", "gradscope", "run", lora_w, "--ops-library",
                     ops_library])
    assert code == 2, (code, out)
    assert f"--ops-library {ops_library}: cannot load it" in out, out
    assert "register the namespace gradscope" in out, out


def test_sigpipe_leaves_no_temporary(gradscope_bin, lora_w, tmp_path):
    folder = str(tmp_path)
    # Several cases: the console report goes on after the dump's temporary is open.
    pipeline = (f"'{gradscope_bin}' run '{lora_w}' --dump d.h5 | head -c 10; "
                "echo \" ${PIPESTATUS[0]}\"")
    p = subprocess.run(["bash", "-c", pipeline], cwd=folder, capture_output=True, text=True,
                       timeout=300)
    # The run was cut off by the signal (128 + 13), after it had printed.
    assert len(p.stdout) > 10 and p.stdout.rstrip().endswith(" 141"), (p.stdout, p.stderr)
    left = os.listdir(folder)
    assert not [n for n in left if ".tmp." in n], left


def test_no_partial_folder(gradscope_bin, tmp_path):
    tmp = str(tmp_path)
    out = os.path.join(tmp, "drawn")

    def no_file_writes():
        resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))

    p = subprocess.run([gradscope_bin, "sample", "--count", "50", "--cases-out", out],
                       capture_output=True, text=True, timeout=300, preexec_fn=no_file_writes)
    assert p.returncode == 2, (p.returncode, p.stdout, p.stderr)
    assert "drawn" in p.stderr, p.stderr
    left = [n for n in os.listdir(tmp) if n.startswith("drawn")]
    assert not left, left


def test_decode_bomb(gradscope_bin, lora_w, tmp_path):
    import h5py
    import numpy as np

    dump = str(tmp_path / "bomb.h5")
    code, out = run([gradscope_bin, "run", lora_w, "--filter", "*k256n256*", "--dump", dump,
                     "--quiet"])
    assert code == 0, out
    with h5py.File(dump, "a") as f:
        case = f[next(iter(f.keys()))]
        # 400 M doubles (3.2 GB decoded) stored in about 20 KB.
        d = case.create_dataset("bomb", shape=(400_000_000,), dtype="f8", compression="gzip",
                                chunks=(1 << 20,), fillvalue=0.0)
        d[: 1 << 20] = np.zeros(1 << 20)
        d.attrs["dtype"] = "fp32"

    def three_gib():
        resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))

    p = subprocess.run([gradscope_bin, "show", dump], capture_output=True, text=True,
                       timeout=120, preexec_fn=three_gib)
    assert p.returncode == 2, (p.returncode, p.stderr)
    assert "bomb.h5" in p.stderr and "/bomb decode to" in p.stderr, p.stderr
    assert "memory this process may use" in p.stderr, p.stderr

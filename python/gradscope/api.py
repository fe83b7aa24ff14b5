"""The command line in-process, and a test-facing check() over it."""
import dataclasses
import importlib
import json
import os
import sys
import tempfile
from typing import TYPE_CHECKING, Dict, Iterable, List, Optional, Sequence, Union

if TYPE_CHECKING:
    import torch

from . import _gradscope


class GradscopeInputError(ValueError):
    """The run could not judge its cases (exit code 2): a bad case, file, flag or operator."""


@dataclasses.dataclass
class Check:
    path: str
    status: str  # "pass", "fail" or "out_of_range" (not judged: the case's range or conditioning)
    message: str  # the failure message, or why it was not judged; empty when it passed
    max_abs: Optional[float]  # worst |prod - ref|
    limit: Optional[float]  # what the rule allowed there
    name: str = ""  # check_module: the module's own path of the tensor (lora_A.default.weight.grad)
    # What max_abs measures: the largest |prod - ref|, or end to end (check_model) "frobenius"
    # (||prod - ref||), "mean_abs" (per-token losses) or "abs" (the model's loss).
    statistic: str = "max_abs"

    @property
    def passed(self) -> bool:
        return self.status == "pass"


@dataclasses.dataclass
class Case:
    id: str
    kind: str
    status: str  # "pass", "fail", "invalid" or "unsupported"
    checks: List[Check]
    replay: str
    unsupported: Optional[str] = None  # the implementation's message when it declined

    @property
    def passed(self) -> bool:
        return self.status == "pass"


def _split_imports(argv: Sequence[str]):
    """Takes every `--import MODULE` (or --import=MODULE) out of argv."""
    imports, rest, i = [], [], 0
    while i < len(argv):
        a = argv[i]
        if a == "--import":
            if i + 1 >= len(argv):
                raise GradscopeInputError("--import needs a module name")
            imports.append(argv[i + 1])
            i += 2
            continue
        if a.startswith("--import="):
            imports.append(a.split("=", 1)[1])
        else:
            rest.append(a)
        i += 1
    return imports, rest


def _import_all(modules: Iterable[str]) -> None:
    for name in modules:
        try:
            importlib.import_module(name)
        # Anything the module raises at import, SystemExit and KeyboardInterrupt included, is
        # a fault of that input: exit 2 from the command line, an exception from check(),
        # never the process ending from inside gradscope with the module's own code.
        except BaseException as e:
            what = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
            if isinstance(e, SystemExit):
                what = f"SystemExit({e.code!r}) (the module called sys.exit at import)"
            raise GradscopeInputError(f"--import {name}: {what}") from e


def define_ops(library, names: Optional[Iterable[str]] = None) -> None:
    """Defines the contract's operators (all but the optional decoder_layer, or `names`) in a
    torch.library.Library("ns", "DEF"), so an implementation registers only their kernels:
    library.impl(name, fn, key)."""
    for name in names if names is not None else OP_SCHEMAS_ORDER:
        library.define(_gradscope.OP_SCHEMAS[name])


# What define_ops(library) defines; the optional decoder_layer only when named.
OP_SCHEMAS_ORDER = ("dequantize", "lora_w", "lora_qkv", "lora_mlp")


def _run(args: Sequence[str]) -> int:
    sys.stdout.flush()
    sys.stderr.flush()
    return _gradscope.run_cli(list(args))


# The commands that take --import: they run an implementation and print replay lines naming
# its modules. Elsewhere --import only imports.
_COMMANDS_NAMING_IMPORTS = ("run", "sample")


def main(argv: Optional[Sequence[str]] = None) -> int:
    """`python -m gradscope ARGS`: the gradscope command line, plus --import MODULE."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        imports, rest = _split_imports(argv)
        _import_all(imports)
    except GradscopeInputError as e:
        print(f"gradscope: {e}", file=sys.stderr)
        return 2
    if rest and rest[0] == "model":  # the Python package's own command (model_command.py)
        from .model_command import main as model_main

        return model_main(rest[1:])
    if rest and rest[0] in _COMMANDS_NAMING_IMPORTS:
        for name in imports:
            rest += ["--import", name]
    return _run(rest)


def _selection(cases: Union[str, Sequence[str]], suite: Optional[str],
               filter: Union[None, str, Sequence[str]], device: Optional[str],
               dtype: Optional[str], seed: Optional[int]) -> List[str]:
    """The command line's case selection: files, --filter per glob, suite and overrides."""
    args = [cases] if isinstance(cases, str) else list(cases)
    globs = [] if filter is None else [filter] if isinstance(filter, str) else list(filter)
    for glob in globs:
        args += ["--filter", str(glob)]
    for flag, value in (("--suite", suite), ("--device", device), ("--dtype", dtype),
                        ("--seed", seed)):
        if value is not None:
            args += [flag, str(value)]
    return args


def failure_lines(case: "Case", named: bool = False) -> List[str]:
    """A failing case as gradscope reports it: its id, each failing check's message (after the
    tensor's `name` when `named`), how many were not judged, the replay line."""
    lines = [f"{case.id}:"]
    lines += [f"  {k.name}: {k.message}" if named else f"  {k.message}"
              for k in case.checks if k.status == "fail"]
    not_judged = sum(k.status == "out_of_range" for k in case.checks)
    if not_judged:
        lines.append(f"  ({not_judged} more checks not judged: out of range, or past the "
                     "floor's model)")
    lines.append(f"  replay: {case.replay}")
    return lines


class _CapturedFd:
    """Output of the C++ side (file descriptors 1 and 2) into temporary files."""

    def __enter__(self):
        sys.stdout.flush()
        sys.stderr.flush()
        self._saved, self._files = [], []
        for fd in (1, 2):
            f = tempfile.TemporaryFile(mode="w+b")
            self._saved.append(os.dup(fd))
            os.dup2(f.fileno(), fd)
            self._files.append(f)
        return self

    def __exit__(self, *exc):
        for fd, saved in zip((1, 2), self._saved):
            os.dup2(saved, fd)
            os.close(saved)
        self.out, self.err = [], []
        for f, sink in zip(self._files, ("out", "err")):
            f.seek(0)
            setattr(self, sink, f.read().decode(errors="replace"))
            f.close()
        return False


def check(
    cases: Sequence[str] = (),
    *,
    suite: Optional[str] = None,
    impl: str = "gradscope",
    imports: Iterable[str] = (),
    ops_libraries: Iterable[str] = (),
    filter: Union[None, str, Sequence[str]] = None,
    device: Optional[str] = None,
    dtype: Optional[str] = None,
    seed: Optional[int] = None,
    json_path: Optional[str] = None,
    extra_args: Sequence[str] = (),
    raise_on_failure: bool = True,
    allow_unsupported: bool = False,
    raise_on_invalid: bool = True,
) -> List[Case]:
    """Runs the cases (files, or a suite) with `impl` as prod and returns one Case per case.

    `filter` is a glob or a list of globs (a case is selected when one matches its id).
    Raises GradscopeInputError when the run cannot judge its cases (bad input, a case invalid
    before any check ran, or `impl` declined every case, unless allow_unsupported; a case whose
    checks ran but could not be judged, such as an attention past the floor's model, too
    unless raise_on_invalid is False, which returns it with status "invalid") and, unless
    raise_on_failure is
    False, AssertionError listing every failing check with its message and the command that
    replays the case.
    """
    __tracebackhide__ = True  # pytest shows the caller's line and the message, not ours
    imports = list(imports)
    _import_all(imports)
    with tempfile.TemporaryDirectory(prefix="gradscope-check-") as scratch:
        report = json_path or os.path.join(scratch, "report.json")
        args = ["run", *_selection(cases, suite, filter, device, dtype, seed), "--quiet",
                "--json", report, "--impl", impl]
        for lib in ops_libraries:
            args += ["--ops-library", lib]
        for name in imports:
            args += ["--import", name]
        if allow_unsupported:
            args.append("--allow-unsupported")
        args += list(extra_args)
        with _CapturedFd() as captured:
            code = _run(args)
        if not os.path.exists(report):
            raise GradscopeInputError((captured.err or captured.out).strip() or f"exit code {code}")
        with open(report) as f:
            data = json.load(f)
        # Exit 2 with no invalid case: nothing was judged (every case declined). An invalid
        # case without checks is bad input; one whose checks ran but could not be judged is a
        # result, raised after any failure unless raise_on_invalid is False.
        invalid = [c for c in data["cases"] if c["status"] == "invalid"]
        bad_input = [c for c in invalid if not c["checks"]]
        if (code == 2 and not invalid) or bad_input:
            raise GradscopeInputError("\n".join(c["input_error"] for c in bad_input)
                                      or (captured.err or captured.out).strip()
                                      or f"exit code {code}")
    result = [
        Case(
            id=c["id"],
            kind=c["kind"],
            status=c["status"],
            replay=c["replay"],
            unsupported=c.get("unsupported"),
            checks=[
                Check(path=k["path"], status=k["status"], message=k.get("message") or "",
                      max_abs=k.get("max_abs"), limit=k.get("limit"))
                for k in c["checks"]
            ],
        )
        for c in data["cases"]
    ]
    failing = [c for c in result if c.status == "fail"]
    not_judged = [f"{c['id']}: not judged: {c['input_error']}" for c in invalid]
    if failing and raise_on_failure:
        lines = [f"{len(failing)} of {len(result)} gradscope cases failed (implementation {impl})"]
        for c in failing:
            lines += failure_lines(c)
        if not_judged:
            lines += [f"{len(not_judged)} more could not be judged:"] + not_judged
        raise AssertionError("\n".join(lines))
    if not_judged and raise_on_invalid:
        raise GradscopeInputError("\n".join(not_judged))
    return result


def _run_command(args: Sequence[str]) -> str:
    """Runs a command that prints no report; its stdout, or GradscopeInputError with its
    message when it does not exit 0."""
    __tracebackhide__ = True
    with _CapturedFd() as captured:
        code = _run(args)
    if code != 0:
        raise GradscopeInputError((captured.err or captured.out).strip() or f"exit code {code}")
    return captured.out


def make_case(
    cases: Sequence[str] = (),
    *,
    suite: Optional[str] = None,
    filter: Union[None, str, Sequence[str]] = None,
    device: Optional[str] = None,
    dtype: Optional[str] = None,
    seed: Optional[int] = None,
) -> Dict[str, "torch.Tensor"]:
    """One case's generated tensors by name (x, output gradients, each projection's packed base,
    adapters and bias, a stack's norms: the names a case's `tensors` file takes), on the host.
    The selection must hold exactly one case; raises GradscopeInputError otherwise."""
    __tracebackhide__ = True
    try:
        from safetensors.torch import load_file
    except ImportError as e:
        raise GradscopeInputError("make_case reads the case's tensors with the safetensors "
                                  "package: pip install safetensors") from e
    with tempfile.TemporaryDirectory(prefix="gradscope-case-") as scratch:
        out = os.path.join(scratch, "case.safetensors")
        _run_command(["tensors", *_selection(cases, suite, filter, device, dtype, seed),
                      "--out", out])
        return load_file(out)


def list_cases(
    cases: Sequence[str] = (),
    *,
    suite: Optional[str] = None,
    filter: Union[None, str, Sequence[str]] = None,
    device: Optional[str] = None,
    dtype: Optional[str] = None,
    seed: Optional[int] = None,
) -> List[str]:
    """The ids of the selected cases (files, or a suite), in the order `check` runs them.

    Raises GradscopeInputError for a selection gradscope refuses (a bad file, no match)."""
    __tracebackhide__ = True
    out = _run_command(["list", *_selection(cases, suite, filter, device, dtype, seed)])
    return [line for line in out.splitlines() if line.strip()]

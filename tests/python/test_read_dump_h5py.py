"""h5py reads a gradscope dump: the README's example, run as a test on a dump of one smoke mlp
case that `gradscope run --dump` writes."""
from __future__ import annotations

import os
import subprocess

import h5py
import numpy as np
import pytest


@pytest.fixture(scope="module")
def dump(gradscope_bin: str, cases_dir: str, tmp_path_factory: pytest.TempPathFactory) -> str:
    path = str(tmp_path_factory.mktemp("h5py_check") / "h5py_check.h5")
    subprocess.run([gradscope_bin, "run", os.path.join(cases_dir, "smoke", "mlp.toml"),
                    "--filter", "mlp.bf16.*.r8.*.act.*.p0.1.*", "--quiet", "--dump", path],
                   check=True)
    return path


def test_the_dump_is_gradscope_s_with_cases(dump: str) -> None:
    with h5py.File(dump, "r") as f:
        assert f.attrs["format"] == b"gradscope-dump" or f.attrs["format"] == "gradscope-dump"
        cases = [name for name in f if "kind" in f[name].attrs]
        assert cases, "no cases in the dump"


def test_the_readme_example(dump: str) -> None:
    with h5py.File(dump, "r") as f:
        # The README's example, step by step, with the values checked.
        case = next(c for c in f if c.startswith("mlp."))
        g = f[f"{case}/layer0/mlp/gate_proj/lora_A.grad"]
        prod, base, ref = (g[k][()] for k in ("prod", "base", "ref"))
        assert g["prod"].attrs["dtype"] in (b"fp32", "fp32"), g["prod"].attrs["dtype"]
        err_prod, err_base = np.abs(prod - ref).max(), np.abs(base - ref).max()
        assert np.isclose(err_prod, g.attrs["max_abs"], rtol=1e-12, atol=0), \
            (err_prod, g.attrs["max_abs"])
        assert np.isclose(err_base, g.attrs["baseline_max_abs"], rtol=1e-12, atol=0)
        assert err_prod <= g.attrs["limit"] and g.attrs["status"] in (b"pass", "pass")
        x = f[f"{case}/inputs/x"][()]
        assert x.shape == (2, 32, 256), x.shape
        toml = f[case].attrs["case_toml"]
        assert b'kind = "mlp"' in (toml if isinstance(toml, bytes) else toml.encode())
        print(f"{case}: gate_proj lora_A.grad {prod.shape}, err(prod) {err_prod:.3g}, "
              f"err(base) {err_base:.3g}")

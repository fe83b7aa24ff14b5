#!/usr/bin/env python3
"""h5py reads a gradscope dump: the README's example, run as a test.

Usage: read_dump_h5py.py DUMP.h5
"""
import sys

import h5py
import numpy as np


def main(path: str) -> int:
    with h5py.File(path, "r") as f:
        assert f.attrs["format"] == b"gradscope-dump" or f.attrs["format"] == "gradscope-dump"
        cases = [name for name in f if "kind" in f[name].attrs]
        assert cases, "no cases in the dump"
        # The README's example, step by step, with the values checked.
        case = next(c for c in f if c.startswith("mlp."))
        g = f[f"{case}/layer0/mlp/gate_proj/lora_A.grad"]
        prod, base, ref = (g[k][()] for k in ("prod", "base", "ref"))
        assert g["prod"].attrs["dtype"] in (b"fp32", "fp32"), g["prod"].attrs["dtype"]
        err_prod, err_base = np.abs(prod - ref).max(), np.abs(base - ref).max()
        assert np.isclose(err_prod, g.attrs["max_abs"], rtol=1e-12, atol=0), (err_prod, g.attrs["max_abs"])
        assert np.isclose(err_base, g.attrs["baseline_max_abs"], rtol=1e-12, atol=0)
        assert err_prod <= g.attrs["limit"] and g.attrs["status"] in (b"pass", "pass")
        x = f[f"{case}/inputs/x"][()]
        assert x.shape == (2, 32, 256), x.shape
        toml = f[case].attrs["case_toml"]
        assert b'kind = "mlp"' in (toml if isinstance(toml, bytes) else toml.encode())
        print(f"{case}: gate_proj lora_A.grad {prod.shape}, err(prod) {err_prod:.3g}, err(base) {err_base:.3g}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))

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
        # The README's example: one projection's gradients, prod vs reference.
        case = next(c for c in cases if c.startswith("mlp."))
        grad = f[f"{case}/layer0/mlp/gate_proj/lora_A.grad"]
        prod, ref = grad["prod"][()], grad["ref"][()]
        err = np.abs(prod - ref).max()
        assert np.isclose(err, grad.attrs["max_abs"], rtol=1e-12, atol=0), (err, grad.attrs["max_abs"])
        assert grad["prod"].attrs["dtype"] in (b"fp32", "fp32")
        print(f"{case}: gate_proj lora_A.grad {prod.shape}, max |prod - ref| = {err:.3g}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))

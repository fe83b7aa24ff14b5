"""The Python `safetensors` package and gradscope read each other's files.

Usage: safetensors_interop.py GRADSCOPE_BINARY FIXTURE_DIR SCRATCH_DIR
1. safetensors reads the fixture `gradscope export` wrote: dtypes and shapes as the
   GPTQ layout says.
2. safetensors rewrites those tensors into a new checkpoint; `gradscope run --checkpoint`
   passes on it and `gradscope dequant` gives the same weight as from the original.
"""
import os
import shutil
import subprocess
import sys

import h5py
import numpy as np
from safetensors.numpy import load_file, save_file


def main(binary, fixture, scratch):
    tensors = load_file(os.path.join(fixture, "model.safetensors"))
    q = tensors["model.layers.0.self_attn.o_proj.qweight"]
    assert q.dtype == np.int32 and q.shape == (64 * 4 // 32, 64), (q.dtype, q.shape)
    assert tensors["model.layers.0.self_attn.o_proj.scales"].dtype == np.float16
    assert len([n for n in tensors if n.endswith(".qweight")]) == 7

    shutil.rmtree(scratch, ignore_errors=True)
    os.makedirs(scratch)
    for name in ("config.json", "quantize_config.json"):
        shutil.copy(os.path.join(fixture, name), scratch)
    save_file(tensors, os.path.join(scratch, "model.safetensors"), metadata={"format": "pt"})
    subprocess.run([binary, "run", "--checkpoint", scratch, "--quiet"], check=True)
    module = "model.layers.0.mlp.down_proj"
    weights = []
    for source, out in ((fixture, "a.h5"), (scratch, "b.h5")):
        path = os.path.join(scratch, out)
        subprocess.run([binary, "dequant", "--checkpoint", source, "--module", module, "--out", path],
                       check=True, stdout=subprocess.DEVNULL)
        with h5py.File(path) as f:
            weights.append(f["weight"][()])
    assert weights[0].shape == (64, 128) and np.array_equal(weights[0], weights[1])
    print("safetensors", "interop ok:", len(tensors), "tensors")
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:4]))

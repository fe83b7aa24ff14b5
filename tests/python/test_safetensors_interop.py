"""The Python `safetensors` package and gradscope read each other's files.

1. safetensors reads the fixture `gradscope export` wrote (tests/data/tiny-gptq-v1-act):
   dtypes and shapes as the GPTQ layout says.
2. safetensors rewrites those tensors into a new checkpoint; `gradscope run --checkpoint`
   passes on it and `gradscope dequant` gives the same weight as from the original.
"""
from __future__ import annotations

import os
import shutil
import subprocess
from typing import Dict

import h5py
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file


@pytest.fixture(scope="module")
def fixture(tiny_gptq: str) -> str:
    return tiny_gptq


@pytest.fixture(scope="module")
def tensors(fixture: str) -> Dict[str, np.ndarray]:
    return load_file(os.path.join(fixture, "model.safetensors"))


@pytest.fixture(scope="module")
def rewritten(fixture: str, tensors: Dict[str, np.ndarray],
              tmp_path_factory: pytest.TempPathFactory) -> str:
    """The fixture's tensors saved again by safetensors, with the fixture's configs."""
    scratch = str(tmp_path_factory.mktemp("safetensors_interop"))
    for name in ("config.json", "quantize_config.json"):
        shutil.copy(os.path.join(fixture, name), scratch)
    save_file(tensors, os.path.join(scratch, "model.safetensors"), metadata={"format": "pt"})
    return scratch


def test_safetensors_reads_the_export(tensors: Dict[str, np.ndarray]) -> None:
    q = tensors["model.layers.0.self_attn.o_proj.qweight"]
    assert q.dtype == np.int32 and q.shape == (64 * 4 // 32, 64), (q.dtype, q.shape)
    assert tensors["model.layers.0.self_attn.o_proj.scales"].dtype == np.float16
    assert len([n for n in tensors if n.endswith(".qweight")]) == 7


def test_gradscope_runs_the_rewritten_checkpoint(gradscope_bin: str, rewritten: str) -> None:
    r = subprocess.run([gradscope_bin, "run", "--checkpoint", rewritten, "--quiet"])
    assert r.returncode == 0


def test_the_rewritten_checkpoint_dequantizes_the_same(gradscope_bin: str, fixture: str,
                                                       rewritten: str) -> None:
    module = "model.layers.0.mlp.down_proj"
    weights = []
    for source, out in ((fixture, "a.h5"), (rewritten, "b.h5")):
        path = os.path.join(rewritten, out)
        subprocess.run([gradscope_bin, "dequant", "--checkpoint", source, "--module", module,
                        "--out", path], check=True, stdout=subprocess.DEVNULL)
        with h5py.File(path) as f:
            weights.append(f["weight"][()])
    assert weights[0].shape == (64, 128) and np.array_equal(weights[0], weights[1])

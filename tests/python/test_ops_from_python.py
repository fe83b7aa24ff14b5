"""Python calls the production ops through torch.ops after loading libgradscope_ops.so.

1. torch.ops.gradscope.dequantize on a checkpoint's tensors (read by the safetensors
   package) equals `gradscope dequant` of the same module bit for bit, for the int32 words
   and for their bit-exact float view (FSDP storage); an unknown zero_format is refused.
2. lora_w, lora_qkv and lora_mlp run forward and backward under Python autograd; their
   outputs and the gradients of x and every adapter agree with the same math written here
   in plain torch in fp64 (on the op's own dequantized weights).
"""
from __future__ import annotations

import json
import os
import subprocess
from typing import Any, Callable, Dict, List, Tuple

import h5py
import pytest
import torch
from safetensors.torch import load_file

RANK = 4
ALPHA = 8.0  # the ops derive scaling = alpha / rank (no rsLoRA) from lora_A's rows
SCALING = ALPHA / RANK
TOKENS = 24

Tensors = Dict[str, torch.Tensor]
Projection = Tuple[List[torch.Tensor], torch.Tensor]
MakeProjection = Callable[[str], Projection]
Format = Tuple[int, str]


@pytest.fixture(scope="module")
def fixture(tiny_gptq: str) -> str:
    return tiny_gptq


@pytest.fixture(scope="module")
def ops(loadable_ops_library: str) -> Any:
    torch.ops.load_library(loadable_ops_library)
    return torch.ops.gradscope


@pytest.fixture(scope="module")
def quant_format(fixture: str) -> Format:
    with open(os.path.join(fixture, "quantize_config.json")) as f:
        config = json.load(f)
    return config["bits"], config["checkpoint_format"]


@pytest.fixture(scope="module")
def tensors(fixture: str) -> Tensors:
    return load_file(os.path.join(fixture, "model.safetensors"))


@pytest.fixture(autouse=True)
def _seeded() -> None:
    """Each test draws its adapters and inputs from the same seed whichever tests run first."""
    torch.manual_seed(0)


def module_tensors(tensors: Tensors, module: str) -> List[torch.Tensor]:
    return [tensors[f"{module}.{n}"] for n in ("qweight", "qzeros", "scales", "g_idx")]


@pytest.fixture(scope="module")
def down_proj(gradscope_bin: str, fixture: str,
              tmp_path_factory: pytest.TempPathFactory) -> Tuple[str, torch.Tensor]:
    """The module and its weight as `gradscope dequant` writes it (fp32 W [out, in])."""
    module = "model.layers.0.mlp.down_proj"
    out = str(tmp_path_factory.mktemp("ops_from_python") / "w.h5")
    subprocess.run([gradscope_bin, "dequant", "--checkpoint", fixture, "--module", module,
                    "--out", out], check=True, stdout=subprocess.DEVNULL)
    with h5py.File(out) as f:
        return module, torch.from_numpy(f["weight"][()])


def test_dequantize_equals_the_cli_for_words_and_float_view(
        ops: Any, tensors: Tensors, quant_format: Format,
        down_proj: Tuple[str, torch.Tensor]) -> None:
    bits, fmt = quant_format
    module, expected = down_proj
    qweight, qzeros, scales, g_idx = module_tensors(tensors, module)
    w_t = ops.dequantize(qweight, qzeros, scales, g_idx, bits, fmt, torch.float32)
    assert torch.equal(w_t.t(), expected), "dequantize differs from gradscope dequant"
    w_view = ops.dequantize(qweight.view(torch.float32), qzeros.view(torch.bfloat16), scales,
                            g_idx, bits, fmt, torch.float32)
    assert torch.equal(w_view, w_t), "the float view dequantizes differently"


def test_an_unknown_zero_format_is_refused(ops: Any, tensors: Tensors,
                                          quant_format: Format) -> None:
    bits, _ = quant_format
    qweight, qzeros, scales, g_idx = module_tensors(tensors, "model.layers.0.mlp.down_proj")
    with pytest.raises(RuntimeError, match="zero_format"):
        ops.dequantize(qweight, qzeros, scales, g_idx, bits, "awq", torch.float32)


@pytest.fixture(scope="module")
def projection(ops: Any, tensors: Tensors, quant_format: Format) -> MakeProjection:
    """A layer-0 projection's tensors with random adapters appended, and its W^T [in, out]."""
    bits, fmt = quant_format

    def projection(name: str) -> Projection:
        q = module_tensors(tensors, f"model.layers.0.{name}")
        dense = ops.dequantize(*q, bits, fmt, torch.float32)  # W^T [in, out]
        a = (torch.randn(RANK, dense.shape[0]) * 0.1).requires_grad_()
        b = (torch.randn(dense.shape[1], RANK) * 0.1).requires_grad_()
        return q + [a, b], dense
    return projection


def lora_ref(x: torch.Tensor, proj: List[torch.Tensor],
             dense: torch.Tensor) -> Tuple[torch.Tensor, List[torch.Tensor]]:
    a = proj[4].detach().double().requires_grad_()
    b = proj[5].detach().double().requires_grad_()
    return x @ dense.double() + SCALING * (x @ a.t()) @ b.t(), [a, b]


def check(name: str, got: torch.Tensor, want: torch.Tensor) -> None:
    torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-5,
                               msg=lambda m: f"{name}: {m}")


def test_lora_w(ops: Any, projection: MakeProjection, quant_format: Format) -> None:
    bits, fmt = quant_format
    o, o_dense = projection("self_attn.o_proj")
    x = torch.randn(TOKENS, o_dense.shape[0], requires_grad=True)
    y = ops.lora_w(x, o, bits, fmt, ALPHA, False)
    dy = torch.randn_like(y)
    y.backward(dy)
    xr = x.detach().double().requires_grad_()
    yr, (ar, br) = lora_ref(xr, o, o_dense)
    yr.backward(dy.double())
    for name, got, want in (("lora_w out", y, yr), ("lora_w x.grad", x.grad, xr.grad),
                            ("lora_w lora_A.grad", o[4].grad, ar.grad),
                            ("lora_w lora_B.grad", o[5].grad, br.grad)):
        check(name, got, want)


def test_lora_qkv(ops: Any, projection: MakeProjection, quant_format: Format) -> None:
    bits, fmt = quant_format
    projs = [projection(f"self_attn.{n}_proj") for n in "qkv"]
    x = torch.randn(TOKENS, projs[0][1].shape[0], requires_grad=True)
    outs = ops.lora_qkv(x, projs[0][0], projs[1][0], projs[2][0], bits, fmt, ALPHA, False)
    dys = [torch.randn_like(t) for t in outs]
    torch.autograd.backward(outs, dys)
    xr = x.detach().double().requires_grad_()
    refs = [lora_ref(xr, p, d) for p, d in projs]
    torch.autograd.backward([r[0] for r in refs], [d.double() for d in dys])
    check("lora_qkv x.grad", x.grad, xr.grad)
    for (p, _), (yr, (ar, br)), got in zip(projs, refs, outs):
        check("lora_qkv out", got, yr)
        check("lora_qkv lora_A.grad", p[4].grad, ar.grad)
        check("lora_qkv lora_B.grad", p[5].grad, br.grad)


def test_lora_mlp(ops: Any, projection: MakeProjection, quant_format: Format) -> None:
    """SwiGLU: down(silu(gate(x)) * up(x)), each projection with its LoRA."""
    bits, fmt = quant_format
    projs = [projection(f"mlp.{n}_proj") for n in ("gate", "up", "down")]
    x = torch.randn(TOKENS, projs[0][1].shape[0], requires_grad=True)
    y = ops.lora_mlp(x, projs[0][0], projs[1][0], projs[2][0], bits, fmt, ALPHA, False)
    dy = torch.randn_like(y)
    y.backward(dy)
    xr = x.detach().double().requires_grad_()
    e, (ga, gb) = lora_ref(xr, *projs[0])
    g, (ua, ub) = lora_ref(xr, *projs[1])
    yr, (da, db) = lora_ref(torch.nn.functional.silu(e) * g, *projs[2])
    yr.backward(dy.double())
    check("lora_mlp out", y, yr)
    check("lora_mlp x.grad", x.grad, xr.grad)
    for name, p, ar, br in (("gate", projs[0][0], ga, gb), ("up", projs[1][0], ua, ub),
                            ("down", projs[2][0], da, db)):
        check(f"lora_mlp {name} lora_A.grad", p[4].grad, ar.grad)
        check(f"lora_mlp {name} lora_B.grad", p[5].grad, br.grad)

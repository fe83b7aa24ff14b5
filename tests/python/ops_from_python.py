"""Python calls the production ops through torch.ops after loading libgradscope_ops.so.

Usage: ops_from_python.py OPS_LIBRARY GRADSCOPE_BINARY FIXTURE_DIR SCRATCH_DIR
1. torch.ops.gradscope.dequantize on a checkpoint's tensors (read by the safetensors
   package) equals `gradscope dequant` of the same module bit for bit, for the int32 words
   and for their bit-exact float view (FSDP storage).
2. lora_w, lora_qkv and lora_mlp run forward and backward under Python autograd; their
   outputs and the gradients of x and every adapter agree with the same math written here
   in plain torch in fp64 (on the op's own dequantized weights).
"""
import json
import os
import shutil
import subprocess
import sys

import h5py
import numpy as np
import torch
from safetensors.torch import load_file


def module_tensors(tensors, module):
    return [tensors[f"{module}.{n}"] for n in ("qweight", "qzeros", "scales", "g_idx")]


def main(library, binary, fixture, scratch):
    torch.ops.load_library(library)
    ops = torch.ops.gradscope
    config = json.load(open(os.path.join(fixture, "quantize_config.json")))
    bits, fmt = config["bits"], config["checkpoint_format"]
    tensors = load_file(os.path.join(fixture, "model.safetensors"))

    shutil.rmtree(scratch, ignore_errors=True)
    os.makedirs(scratch)
    module = "model.layers.0.mlp.down_proj"
    out = os.path.join(scratch, "w.h5")
    subprocess.run([binary, "dequant", "--checkpoint", fixture, "--module", module, "--out", out],
                   check=True, stdout=subprocess.DEVNULL)
    with h5py.File(out) as f:
        expected = torch.from_numpy(f["weight"][()])  # fp32 W [out, in]
    qweight, qzeros, scales, g_idx = module_tensors(tensors, module)
    w_t = ops.dequantize(qweight, qzeros, scales, g_idx, bits, fmt, torch.float32)
    assert torch.equal(w_t.t(), expected), "dequantize differs from gradscope dequant"
    w_view = ops.dequantize(qweight.view(torch.float32), qzeros.view(torch.bfloat16), scales,
                            g_idx, bits, fmt, torch.float32)
    assert torch.equal(w_view, w_t), "the float view dequantizes differently"
    try:
        ops.dequantize(qweight, qzeros, scales, g_idx, bits, "awq", torch.float32)
        raise AssertionError("an unknown zero_format was accepted")
    except RuntimeError as e:
        assert "zero_format" in str(e), e

    torch.manual_seed(0)
    rank = 4
    alpha = 8.0  # the ops derive scaling = alpha / rank (no rsLoRA) from lora_A's rows
    scaling = alpha / rank
    tokens = 24

    def projection(name):
        q = module_tensors(tensors, f"model.layers.0.{name}")
        dense = ops.dequantize(*q, bits, fmt, torch.float32)  # W^T [in, out]
        a = (torch.randn(rank, dense.shape[0]) * 0.1).requires_grad_()
        b = (torch.randn(dense.shape[1], rank) * 0.1).requires_grad_()
        return q + [a, b], dense

    def lora_ref(x, proj, dense):
        a, b = proj[4].detach().double().requires_grad_(), proj[5].detach().double().requires_grad_()
        return x @ dense.double() + scaling * (x @ a.t()) @ b.t(), [a, b]

    def check(name, got, want):
        torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-5, msg=lambda m: f"{name}: {m}")

    # lora_w (o_proj)
    o, o_dense = projection("self_attn.o_proj")
    x = torch.randn(tokens, o_dense.shape[0], requires_grad=True)
    y = ops.lora_w(x, o, bits, fmt, alpha, False)
    dy = torch.randn_like(y)
    y.backward(dy)
    xr = x.detach().double().requires_grad_()
    yr, (ar, br) = lora_ref(xr, o, o_dense)
    yr.backward(dy.double())
    for name, got, want in (("lora_w out", y, yr), ("lora_w x.grad", x.grad, xr.grad),
                            ("lora_w lora_A.grad", o[4].grad, ar.grad),
                            ("lora_w lora_B.grad", o[5].grad, br.grad)):
        check(name, got, want)

    # lora_qkv
    projs = [projection(f"self_attn.{n}_proj") for n in "qkv"]
    x = torch.randn(tokens, projs[0][1].shape[0], requires_grad=True)
    outs = ops.lora_qkv(x, projs[0][0], projs[1][0], projs[2][0], bits, fmt, alpha, False)
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

    # lora_mlp (SwiGLU)
    projs = [projection(f"mlp.{n}_proj") for n in ("gate", "up", "down")]
    x = torch.randn(tokens, projs[0][1].shape[0], requires_grad=True)
    y = ops.lora_mlp(x, projs[0][0], projs[1][0], projs[2][0], bits, fmt, alpha, False)
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
    print("ops_from_python: dequantize, lora_w, lora_qkv, lora_mlp match (torch", torch.__version__ + ")")


if __name__ == "__main__":
    main(*sys.argv[1:5])

"""Plausible bugs of a third party's LoRA kernels, none of them in gradscope's fault list, each
registered as its own namespace over tests/python/plain_torch_impl.py's correct code. The
gate must fail every one (CTest third_party_bugs_caught):

  no_dropout_rescale  the dropout mask applied without the 1 / (1 - p) rescale
  ignore_rslora       alpha / r even when rsLoRA asks for alpha / sqrt(r)
  v2_as_v1            gptq_v2 zero points decoded as v1 (stored zero + 1)
  adapter_in_x_dtype  the adapter path computed in the activation dtype (fp16 / bf16)
                      instead of the wider of activation and adapter dtypes
  mask_from_zeros     the adapter term of dX masked where the (dropped) input is 0, a dropout
                      mask read off the values instead of kept (fms-acceleration's fused ops do
                      this): invisible where inputs are continuous (it must pass the smoke
                      lora_w and qkv files), caught where a projection's input holds exact
                      zeros: smoke/range_zero_inputs.toml, and the MLP's h in fp16/bf16
"""
import math

import torch

import gradscope
from plain_torch_impl import make_lora_mlp, make_lora_qkv, unpack_gptq

BUGS = ("no_dropout_rescale", "ignore_rslora", "v2_as_v1", "adapter_in_x_dtype",
        "mask_from_zeros")


class _GradWhereNonzero(torch.autograd.Function):
    """x forward; backward, the gradient only where x != 0."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return grad * (x != 0)


def make_lora_w(bug):
    def lora_w(x, proj, bits, zero_format, lora_alpha, use_rslora, dropout_mask=None,
               dropout_p=0.0):
        qweight, qzeros, scales, g_idx, lora_a, lora_b = proj[:6]
        if bug == "v2_as_v1":
            zero_format = "gptq"
        y = x @ unpack_gptq(qweight, qzeros, scales, g_idx, bits, zero_format).to(x.dtype)
        if len(proj) == 7:
            y = y + proj[6]
        r = lora_a.shape[0]
        rslora = use_rslora and bug != "ignore_rslora"
        scaling = lora_alpha / (math.sqrt(r) if rslora else r)
        dtype = x.dtype if bug == "adapter_in_x_dtype" else lora_a.dtype
        xa = x.to(dtype)
        if dropout_mask is not None:
            xa = xa * dropout_mask.reshape(x.shape).to(dtype)
            if bug != "no_dropout_rescale":
                xa = xa / (1 - dropout_p)
        if bug == "mask_from_zeros":
            xa = _GradWhereNonzero.apply(xa)
        adapter = (xa @ lora_a.to(dtype).t()) @ lora_b.to(dtype).t() * scaling
        return y + adapter.to(y.dtype)

    return lora_w


_libraries = []
for bug in BUGS:
    lib = torch.library.Library(bug, "DEF")
    gradscope.define_ops(lib, ["lora_w", "lora_qkv", "lora_mlp"])
    w = make_lora_w(bug)
    lib.impl("lora_w", w, "CompositeImplicitAutograd")
    lib.impl("lora_qkv", make_lora_qkv(w), "CompositeImplicitAutograd")
    lib.impl("lora_mlp", make_lora_mlp(w), "CompositeImplicitAutograd")
    _libraries.append(lib)


def main(cases_dir):
    """Runs each bug over the smoke LoRA_W files and requires exit 1 (a check failed)."""
    import os
    import subprocess
    import sys

    def smoke(*names):
        return [os.path.join(cases_dir, "smoke", f + ".toml") for f in names]

    files = smoke("lora_w", "lora_w_variants", "mlp_formats", "realistic_lora",
                  "range_adapter_grads")
    runs = [(bug, files, 1) for bug in BUGS]
    # Continuous inputs hide it (the MLP's h is no such input: its fp16/bf16 products underflow
    # to exact zeros, and the files above catch the bug there)...
    runs.append(("mask_from_zeros", smoke("lora_w", "qkv"), 0))
    # ... and activations with exact zeros show it.
    runs.append(("mask_from_zeros", smoke("range_zero_inputs"), 1))
    for bug, run_files, expected in runs:
        p = subprocess.run([sys.executable, "-m", "gradscope", "run", *run_files, "--quiet",
                            "--impl", bug, "--import", "third_party_bugs"],
                           capture_output=True, text=True)
        summary = [line for line in p.stdout.splitlines() if " passed, " in line][-1:]
        print(f"{bug} over {len(run_files)} files: exit {p.returncode} (expected {expected}); "
              f"{summary[0] if summary else p.stderr.strip()}")
        assert p.returncode == expected, p.stdout + p.stderr


if __name__ == "__main__":
    import sys

    main(sys.argv[1])

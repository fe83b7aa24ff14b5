"""Plausible bugs of a third party's LoRA kernels, none of them in gradscope's fault list, each
registered as its own namespace over tests/python/plain_torch_impl.py's correct code
(`python -m gradscope run ... --impl BUG --import third_party_bugs`). The gate must fail every
one, and the tail and type-pair bugs of tests/python/tail_and_pair_bugs.py too
(tests/python/test_third_party_bugs.py, CTest third_party_bugs_caught):

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
  bf16_via_fp16       bf16 activations cast to fp16 for the base GEMM and back (an fp16-only
                      kernel behind a cast), forward and, through autograd, dX: fp16's 11-bit
                      significand is finer than bf16's, so it passes ordinary values (the smoke
                      lora_w and mlp files) and fails where bf16 holds what fp16 cannot: values
                      of 1e-6 (smoke/range_small_values.toml)

`third_party_bugs.py --survey FILE...` prints which files catch each tail and pair bug.
"""
import math

import torch

import gradscope
from plain_torch_impl import make_lora_mlp, make_lora_qkv, unpack_gptq

BUGS = ("no_dropout_rescale", "ignore_rslora", "v2_as_v1", "adapter_in_x_dtype",
        "mask_from_zeros", "bf16_via_fp16")


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
        w = unpack_gptq(qweight, qzeros, scales, g_idx, bits, zero_format).to(x.dtype)
        if bug == "bf16_via_fp16" and x.dtype == torch.bfloat16:
            y = (x.to(torch.float16) @ w.to(torch.float16)).to(x.dtype)
        else:
            y = x @ w
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


def gradscope_run(impl, module, files, *extra):
    """`python -m gradscope run FILES --quiet --impl IMPL --import MODULE EXTRA...`: the process
    and its summary line (its error where it has none)."""
    import subprocess
    import sys

    p = subprocess.run([sys.executable, "-m", "gradscope", "run", *files, "--quiet", "--impl",
                        impl, "--import", module, *extra], capture_output=True, text=True)
    summary = [line for line in p.stdout.splitlines() if " passed, " in line][-1:]
    return p, summary[0] if summary else p.stderr.strip()


def survey(files):
    """Which files catch each tail and pair bug: one line per (bug, file), for the logs."""
    import os

    import tail_and_pair_bugs

    for bug in tail_and_pair_bugs.BUGS:
        caught = []
        for f in files:
            p, summary = gradscope_run(bug, "tail_and_pair_bugs", [f])
            name = os.path.basename(f)
            print(f"{bug:24s} {name:28s} exit {p.returncode}  {summary}", flush=True)
            if p.returncode == 1:
                caught.append(name)
        print(f"{bug}: caught by {len(caught)} of {len(files)} files"
              f"{': ' + ', '.join(caught) if caught else ' (MISSED)'}", flush=True)


if __name__ == "__main__":
    import sys

    if len(sys.argv) < 3 or sys.argv[1] != "--survey":
        sys.exit("usage: third_party_bugs.py --survey FILE...  (the gate's tests: "
                 "python3 -m pytest tests/python/test_third_party_bugs.py)")
    survey(sys.argv[2:])

"""Plausible bugs of a third party's LoRA kernels, none of them in gradscope's fault list, each
registered as its own namespace over tests/python/plain_torch_impl.py's correct code. The
gate must fail every one (CTest third_party_bugs_caught), and the tail and type-pair bugs of
tests/python/tail_and_pair_bugs.py too:

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


def _gradscope(impl, module, files, *extra):
    import subprocess
    import sys

    p = subprocess.run([sys.executable, "-m", "gradscope", "run", *files, "--quiet", "--impl", impl,
                        "--import", module, *extra], capture_output=True, text=True)
    summary = [line for line in p.stdout.splitlines() if " passed, " in line][-1:]
    return p, summary[0] if summary else p.stderr.strip()


def smoke_files(cases_dir, first=()):
    """Every smoke file, those named in `first` ahead (the run stops at the first failure)."""
    import glob
    import os

    files = sorted(glob.glob(os.path.join(cases_dir, "smoke", "*.toml")))
    ahead = [f for f in files if os.path.basename(f).startswith(tuple(first))]
    return ahead + [f for f in files if f not in ahead]


def main(cases_dir, device_args=()):
    """Runs each bug over the smoke files and requires exit 1 (a check failed); device_args
    (["--device", "cuda"]) are passed to every run."""
    import os

    def smoke(*names):
        return [os.path.join(cases_dir, "smoke", f + ".toml") for f in names]

    files = smoke("lora_w", "lora_w_variants", "mlp_formats", "realistic_lora",
                  "range_adapter_grads")
    runs = [(bug, "third_party_bugs", files, 1, ()) for bug in BUGS if bug != "bf16_via_fp16"]
    # Continuous inputs hide it (the MLP's h is no such input: its fp16/bf16 products underflow
    # to exact zeros, and the files above catch the bug there)...
    runs.append(("mask_from_zeros", "third_party_bugs", smoke("lora_w", "qkv"), 0, ()))
    # ... and activations with exact zeros show it.
    runs.append(("mask_from_zeros", "third_party_bugs", smoke("range_zero_inputs"), 1, ()))
    # Ordinary bf16 values hide an fp16 intermediate; values below fp16's range show it.
    runs.append(("bf16_via_fp16", "third_party_bugs", smoke("lora_w", "mlp"), 0, ()))
    runs.append(("bf16_via_fp16", "third_party_bugs", smoke("range_small_values"), 1, ()))
    # The tail and type-pair bugs: the whole smoke suite, stopping at the first failing case,
    # and the same implementation without a bug passes the files written for them.
    import tail_and_pair_bugs

    new_files = smoke_files(cases_dir, first=("pairs_", "tails_"))
    for bug in tail_and_pair_bugs.BUGS:
        runs.append((bug, "tail_and_pair_bugs", new_files, 1, ("--fail-fast",)))
    runs.append(("tail_and_pair_correct", "tail_and_pair_bugs",
                 [f for f in new_files if os.path.basename(f).startswith(("pairs_", "tails_"))],
                 0, ()))
    for bug, module, run_files, expected, extra in runs:
        p, summary = _gradscope(bug, module, run_files, *extra, *device_args)
        print(f"{bug} over {len(run_files)} files: exit {p.returncode} (expected {expected}); "
              f"{summary}")
        assert p.returncode == expected, p.stdout + p.stderr


def survey(files):
    """Which files catch each tail and pair bug: one line per (bug, file), for the logs."""
    import os

    import tail_and_pair_bugs

    for bug in tail_and_pair_bugs.BUGS:
        caught = []
        for f in files:
            p, summary = _gradscope(bug, "tail_and_pair_bugs", [f])
            name = os.path.basename(f)
            print(f"{bug:24s} {name:28s} exit {p.returncode}  {summary}", flush=True)
            if p.returncode == 1:
                caught.append(name)
        print(f"{bug}: caught by {len(caught)} of {len(files)} files"
              f"{': ' + ', '.join(caught) if caught else ' (MISSED)'}", flush=True)


if __name__ == "__main__":
    import sys

    if len(sys.argv) > 2 and sys.argv[1] == "--survey":
        survey(sys.argv[2:])
    else:
        main(sys.argv[1], sys.argv[2:])

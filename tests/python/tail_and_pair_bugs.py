"""Bugs a third party's GPTQ-LoRA kernels plausibly have where friendly suites never look: the
last partial block of a loop over tokens or features, a path taken for one pair of type axes
only, a dtype policy. None is in gradscope's fault list, and the smoke suite was not designed
around them: each was written first and run against the suites as they stood (the survey log
docs/measurements/tail-and-pair-bugs-survey.log). Each bug is a namespace registered over a
plain-PyTorch implementation that is otherwise correct (every bit width, both zero formats,
both layouts). CTest third_party_bugs_caught requires the smoke suite to fail each one.

  token_tail_no_adapter  tokens past the last whole block of 16 get no adapter term (a BLOCK_M
                         tail masked off)
  odd_token_pairs        tokens processed two at a time: with an odd count the last token's
                         adapter term is its predecessor's (a pointer not advanced)
  grad_token_tail        lora_A.grad and lora_B.grad summed over whole 8-token chunks only (a
                         split-K remainder guard `t + 8 <= T`)
  k_tail_tile            weight rows past the last whole tile of 16 rows dequantize to zero
  n_tail_bias            the bias added in tiles of 16 output columns, the partial last tile
                         skipped
  bf16_scales_fma        with bf16 scales and bf16 output, W = q s - round(s z) (a precomputed
                         scaled zero rounded to bf16 first)
  out_in_v1_zeros        the W [out, in] layout decodes zero points as v1 whatever the format
  lora_asym_as_sym       the fused LoRA ops take the symmetric zero (maxq + 1) / 2 for every
                         case, asymmetric ones included (dequantize itself is right)
  grad_a_in_bf16         with bf16 activations and fp32 adapters, lora_A.grad's token sum
                         computed in bf16 and then widened (bf16 cannot overflow, so the
                         kernel's author kept it narrow)
"""
import math

import torch

import gradscope
from plain_torch_impl import make_lora_mlp, make_lora_qkv

BUGS = ("token_tail_no_adapter", "odd_token_pairs", "grad_token_tail", "k_tail_tile",
        "n_tail_bias", "bf16_scales_fma", "out_in_v1_zeros", "lora_asym_as_sym",
        "grad_a_in_bf16")

TOKEN_BLOCK = 16
GRAD_CHUNK = 8
FEATURE_TILE = 16


def _unpack_rows(words, bits, count):
    """Field i of each column of int32 `words` [W, C] packed along dim 0, as int64 [count, C];
    a 3-bit field that straddles two words is read from the 64-bit pair."""
    u = words.long() & 0xFFFFFFFF
    u = torch.cat([u, torch.zeros_like(u[:1])])
    bit = torch.arange(count, device=words.device) * bits
    word = bit // 32
    pair = u[word] | (u[word + 1] << 32)
    return (pair >> (bit % 32).unsqueeze(1)) & ((1 << bits) - 1)


def _weight_t(qweight, qzeros, scales, g_idx, bits, zero_format, dtype, bug, lora=False):
    """W^T [in, out] in `dtype`, with `bug`'s mistake where it applies."""
    k, n = g_idx.shape[0], scales.shape[1]
    codes = _unpack_rows(qweight, bits, k)
    zeros = _unpack_rows(qzeros.t(), bits, n).t()
    if zero_format == "gptq":  # v1 stores zero - 1
        zeros = zeros + 1
    if lora and bug == "lora_asym_as_sym":
        zeros = torch.full_like(zeros, 1 << (bits - 1))
    g = g_idx.long()
    s = scales.float()
    if bug == "bf16_scales_fma" and scales.dtype == torch.bfloat16 and dtype == torch.bfloat16:
        scaled_zero = (s * zeros.float()).to(torch.bfloat16).float()
        w = s[g] * codes.float() - scaled_zero[g]
    else:
        w = s[g] * (codes - zeros[g]).float()
    if bug == "k_tail_tile":
        w[(k // FEATURE_TILE) * FEATURE_TILE:] = 0
    return w.to(dtype)


def make_dequantize(bug):
    def dequantize(qweight, qzeros, scales, g_idx, bits, zero_format, dtype, layout="in_out"):
        if bug == "out_in_v1_zeros" and layout == "out_in":
            zero_format = "gptq"
        w = _weight_t(qweight, qzeros, scales, g_idx, bits, zero_format, dtype, bug)
        return w.t().contiguous() if layout == "out_in" else w

    return dequantize


class _AdapterPath(torch.autograd.Function):
    """(xa A^T) B^T * s with a hand-written backward, as a fused kernel has one; `bug` picks
    the backward's mistake (grad_token_tail, grad_a_in_bf16) or none."""

    @staticmethod
    def forward(ctx, xa, a, b, scaling, x_dtype, bug):
        u = xa @ a.t()
        ctx.save_for_backward(xa, a, b, u)
        ctx.scaling, ctx.x_dtype, ctx.bug = scaling, x_dtype, bug
        return (u @ b.t()) * scaling

    @staticmethod
    def backward(ctx, grad):
        xa, a, b, u = ctx.saved_tensors
        gu = (grad @ b) * ctx.scaling
        dxa = gu @ a
        rows = xa.shape[0]
        if ctx.bug == "grad_token_tail":
            rows = (rows // GRAD_CHUNK) * GRAD_CHUNK
        if ctx.bug == "grad_a_in_bf16" and ctx.x_dtype == torch.bfloat16 and a.dtype == torch.float32:
            da = (gu[:rows].to(ctx.x_dtype).t() @ xa[:rows].to(ctx.x_dtype)).to(a.dtype)
        else:
            da = gu[:rows].t() @ xa[:rows]
        db = (grad[:rows].t() @ u[:rows]) * ctx.scaling
        return dxa, da, db, None, None, None


def make_lora_w(bug):
    def lora_w(x, proj, bits, zero_format, lora_alpha, use_rslora, dropout_mask=None,
               dropout_p=0.0):
        qweight, qzeros, scales, g_idx, lora_a, lora_b = proj[:6]
        features = x.shape[-1]
        x2 = x.reshape(-1, features)
        tokens = x2.shape[0]
        w = _weight_t(qweight, qzeros, scales, g_idx, bits, zero_format, x.dtype, bug, lora=True)
        y = x2 @ w
        if len(proj) == 7:
            bias = proj[6].to(y.dtype)
            if bug == "n_tail_bias":
                keep = torch.zeros_like(bias)
                keep[:(bias.shape[0] // FEATURE_TILE) * FEATURE_TILE] = 1
                bias = bias * keep
            y = y + bias
        r = lora_a.shape[0]
        scaling = lora_alpha / (math.sqrt(r) if use_rslora else r)
        xa = x2.to(lora_a.dtype)
        if dropout_mask is not None:
            xa = xa * dropout_mask.reshape(x2.shape).to(xa.dtype) / (1 - dropout_p)
        adapter = _AdapterPath.apply(xa, lora_a, lora_b, scaling, x.dtype, bug)
        if bug == "token_tail_no_adapter":
            keep = torch.zeros(tokens, 1, dtype=adapter.dtype, device=adapter.device)
            keep[:(tokens // TOKEN_BLOCK) * TOKEN_BLOCK] = 1
            adapter = adapter * keep
        if bug == "odd_token_pairs" and tokens % 2 == 1 and tokens > 1:
            adapter = torch.cat([adapter[:-1], adapter[-2:-1]])
        out = y + adapter.to(y.dtype)
        return out.reshape(*x.shape[:-1], out.shape[-1])

    return lora_w


# Every namespace has all four operators (a bug's mistake only where it applies), and
# tail_and_pair_correct is the same implementation without a bug: it must pass what they fail.
_libraries = []
for _bug in BUGS + ("tail_and_pair_correct",):
    _lib = torch.library.Library(_bug, "DEF")
    gradscope.define_ops(_lib)
    _lib.impl("dequantize", make_dequantize(_bug), "CompositeImplicitAutograd")
    _w = make_lora_w(_bug)
    _lib.impl("lora_w", _w, "CompositeImplicitAutograd")
    _lib.impl("lora_qkv", make_lora_qkv(_w), "CompositeImplicitAutograd")
    _lib.impl("lora_mlp", make_lora_mlp(_w), "CompositeImplicitAutograd")
    _libraries.append(_lib)  # a Library unregisters its operators when collected

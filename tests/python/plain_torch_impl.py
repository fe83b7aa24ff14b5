"""An implementation under test written in plain PyTorch, registered with torch.library the
way a third party's package would register its kernels (docs/implementations.md).

    python -m gradscope run cases/smoke/lora_w.toml --impl plain_py --import plain_torch_impl

Namespaces:
  plain_py           all four operators, correct; 3-bit weights raise NotImplementedError
                     (the case is reported unsupported)
  plain_py_unscaled  the same with the adapter scaling left out of every forward
"""
import math

import torch

import gradscope


def unpack_gptq(qweight, qzeros, scales, g_idx, bits, zero_format):
    """W^T [in, out] in fp32: scale * (code - zero), from the packed words (2, 4 or 8 bits)."""
    if 32 % bits != 0:
        raise NotImplementedError(f"plain_py: {bits}-bit words are not unpacked here")
    per_word, maxq = 32 // bits, (1 << bits) - 1
    shifts = torch.arange(0, 32, bits, dtype=torch.int32, device=qweight.device)
    codes = (qweight.unsqueeze(1) >> shifts.view(1, -1, 1)) & maxq  # [K/per, per, N]
    codes = codes.reshape(-1, qweight.shape[1])
    zeros = (qzeros.unsqueeze(2) >> shifts.view(1, 1, -1)) & maxq  # [G, N/per, per]
    zeros = zeros.reshape(qzeros.shape[0], -1)
    if zero_format == "gptq":  # v1 stores zero - 1
        zeros = zeros + 1
    g = g_idx.long()
    return scales.float()[g] * (codes - zeros[g]).float()


def dequantize(qweight, qzeros, scales, g_idx, bits, zero_format, dtype, layout="in_out"):
    w = unpack_gptq(qweight, qzeros, scales, g_idx, bits, zero_format).to(dtype)
    return w.t().contiguous() if layout == "out_in" else w


def make_lora_w(scaled):
    def lora_w(x, proj, bits, zero_format, lora_alpha, use_rslora, dropout_mask=None,
               dropout_p=0.0):
        qweight, qzeros, scales, g_idx, lora_a, lora_b = proj[:6]
        w = unpack_gptq(qweight, qzeros, scales, g_idx, bits, zero_format).to(x.dtype)
        y = x @ w
        if len(proj) == 7:
            y = y + proj[6]
        r = lora_a.shape[0]
        scaling = lora_alpha / (math.sqrt(r) if use_rslora else r)
        xa = x.to(lora_a.dtype)
        if dropout_mask is not None:
            xa = xa * dropout_mask.reshape(x.shape).to(xa.dtype) / (1 - dropout_p)
        adapter = (xa @ lora_a.t()) @ lora_b.t()
        if scaled:
            adapter = adapter * scaling
        return y + adapter.to(y.dtype)

    return lora_w


def make_lora_qkv(lora_w):
    def lora_qkv(x, q, k, v, bits, zero_format, lora_alpha, use_rslora, dropout_mask=None,
                 dropout_p=0.0):
        return [lora_w(x, p, bits, zero_format, lora_alpha, use_rslora, dropout_mask, dropout_p)
                for p in (q, k, v)]

    return lora_qkv


def make_lora_mlp(lora_w):
    def lora_mlp(x, gate, up, down, bits, zero_format, lora_alpha, use_rslora, dropout_x=None,
                 dropout_h=None, dropout_p=0.0):
        args = (bits, zero_format, lora_alpha, use_rslora)
        e = lora_w(x, gate, *args, dropout_x, dropout_p)
        g = lora_w(x, up, *args, dropout_x, dropout_p)
        h = torch.nn.functional.silu(e) * g  # as Hugging Face's LlamaMLP, in x's dtype
        return lora_w(h, down, *args, dropout_h, dropout_p)

    return lora_mlp


# Plain differentiable ops: CompositeImplicitAutograd lets autograd trace through them.
_libraries = []
for ns, scaled in (("plain_py", True), ("plain_py_unscaled", False)):
    lib = torch.library.Library(ns, "DEF")
    gradscope.define_ops(lib)
    w = make_lora_w(scaled)
    lib.impl("dequantize", dequantize, "CompositeImplicitAutograd")
    lib.impl("lora_w", w, "CompositeImplicitAutograd")
    lib.impl("lora_qkv", make_lora_qkv(w), "CompositeImplicitAutograd")
    lib.impl("lora_mlp", make_lora_mlp(w), "CompositeImplicitAutograd")
    _libraries.append(lib)  # a Library unregisters its operators when collected

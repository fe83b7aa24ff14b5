"""Namespace `fms_acceleration`: fms-acceleration-foak's fused GPTQ LoRA autograd functions
(`fused_ops.unsloth_lora.gptq.fast_lora`: LoRA_W, LoRA_QKV, LoRA_MLP) and its Triton
dequantization (`dequant248`) as the implementation under test.

    python -m gradscope run --suite gpu --impl fms_acceleration \\
        --import gradscope.adapters.fms_acceleration

The adapter hands the case's tensors to the peer's functions as fms-acceleration's own
`get_lora_parameters` does for a peft GPTQ layer: packed words, scales, zeros, g_idx, bits,
bias, lora_A and lora_B weights, the scaling peft derives (alpha / r, or alpha / sqrt(r) with
rsLoRA: fms-acceleration reads peft's), and a dropout module (the case's mask, rescaled as
nn.Dropout does, or nn.Identity; the peer stores its output as `.X` for backward), under
autocast to the activation dtype as in mixed-precision training. A v1 (`gptq`) layer's
qzeros carry `offset = 1`, as `get_lora_parameters` sets for an auto_gptq layer.

Declined as unsupported (NotImplementedError), what the peer does not cover: devices other than
CUDA (Triton), bit widths other than 2, 4 and 8 (dequant248 asserts them), activations other
than fp16 (dequant248 writes fp16 only), and inputs other than [batch, seq, hidden] (the
backward unpacks three dimensions).
"""
import math

import torch
from fms_acceleration_foak.fused_ops.unsloth_lora.gptq import fast_lora
from fms_acceleration_foak.fused_ops.unsloth_lora.gptq.triton.kernels import dequant248

import gradscope
from gradscope.adapters._case_dropout import MaskDropout

NAMESPACE = "fms_acceleration"


def _require(device, bits, dtype, dims=None):
    if device.type != "cuda":
        raise NotImplementedError("fms_acceleration: its Triton kernels run on CUDA only")
    if bits not in (2, 4, 8):
        raise NotImplementedError(f"fms_acceleration: dequant248 supports 2, 4 and 8 bits, not {bits}")
    if dtype != torch.float16:
        raise NotImplementedError(f"fms_acceleration: dequant248 writes fp16 only, not {dtype}")
    if dims is not None and dims != 3:
        raise NotImplementedError("fms_acceleration: the fused backward takes [batch, seq, hidden] "
                                  f"inputs only, not {dims}-D")


def _qzeros(qzeros, zero_format):
    q = qzeros.view_as(qzeros)  # a new tensor object: the attribute stays off the case's tensor
    if zero_format == "gptq":
        q.offset = 1
    return q


def _scaling(lora_a, lora_alpha, use_rslora):
    r = lora_a.shape[0]
    return lora_alpha / math.sqrt(r) if use_rslora else lora_alpha / r


def _dropout(mask, p):
    # A peft layer always has a dropout module (nn.Identity at p = 0), and the peer's backward
    # relies on the flattened input the module's call leaves behind.
    return torch.nn.Identity() if mask is None else MaskDropout(mask, p)


def _projection_args(proj, zero_format, bits, lora_alpha, use_rslora):
    """(qweight, scales, qzeros, g_idx, bits, bias, A, B, S) in LoRA_*.apply's order."""
    qweight, qzeros, scales, g_idx, lora_a, lora_b = proj[:6]
    bias = proj[6] if len(proj) == 7 else None
    return (qweight, scales, _qzeros(qzeros, zero_format), g_idx, bits, bias, lora_a, lora_b,
            _scaling(lora_a, lora_alpha, use_rslora))


def dequantize(qweight, qzeros, scales, g_idx, bits, zero_format, dtype, layout="in_out"):
    _require(qweight.device, bits, dtype)
    w = dequant248(qweight, scales, _qzeros(qzeros, zero_format), g_idx, bits)
    return w.t().contiguous() if layout == "out_in" else w


# The peer runs under autocast to the activation dtype, as in mixed-precision training with
# Hugging Face's Trainer, its use: its backward multiplies fp16 activations by the adapters as
# stored, which without autocast raises for fp32 adapters.
def _autocast(x):
    return torch.autocast(device_type="cuda", dtype=x.dtype)


def lora_w(x, proj, bits, zero_format, lora_alpha, use_rslora, dropout_mask=None, dropout_p=0.0):
    _require(x.device, bits, x.dtype, x.dim())
    with _autocast(x):
        return fast_lora.LoRA_W.apply(x, *_projection_args(proj, zero_format, bits, lora_alpha,
                                                           use_rslora),
                                      _dropout(dropout_mask, dropout_p))


def lora_qkv(x, q, k, v, bits, zero_format, lora_alpha, use_rslora, dropout_mask=None,
             dropout_p=0.0):
    _require(x.device, bits, x.dtype, x.dim())
    args = [a for p in (q, k, v) for a in _projection_args(p, zero_format, bits, lora_alpha,
                                                           use_rslora)]
    drops = [_dropout(dropout_mask, dropout_p) for _ in range(3)]
    with _autocast(x):
        return list(fast_lora.LoRA_QKV.apply(x, *args, *drops))


def lora_mlp(x, gate, up, down, bits, zero_format, lora_alpha, use_rslora, dropout_x=None,
             dropout_h=None, dropout_p=0.0):
    _require(x.device, bits, x.dtype, x.dim())
    args = [a for p in (gate, up, down) for a in _projection_args(p, zero_format, bits,
                                                                  lora_alpha, use_rslora)]
    drops = [_dropout(dropout_x, dropout_p), _dropout(dropout_x, dropout_p),
             _dropout(dropout_h, dropout_p)]
    with _autocast(x):
        return fast_lora.LoRA_MLP.apply(x, *args, *drops)


_library = torch.library.Library(NAMESPACE, "DEF")
gradscope.define_ops(_library)
for _name, _fn in (("dequantize", dequantize), ("lora_w", lora_w), ("lora_qkv", lora_qkv),
                   ("lora_mlp", lora_mlp)):
    _library.impl(_name, _fn, "CompositeImplicitAutograd")

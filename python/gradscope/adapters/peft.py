"""Namespace `peft`: peft's LoRA layer for GPTQ (`peft.tuners.lora.gptq.GPTQLoraLinear`) as the
implementation under test of lora_w, lora_qkv and lora_mlp.

    python -m gradscope run cases/smoke/lora_w.toml --impl peft --import gradscope.adapters.peft

What is peft's: the layer's forward (base output, then the adapter path lora_B(lora_A(dropout(x)))
in the adapters' dtype, times the scaling, added and cast back), the scaling it derives from
lora_alpha, r and use_rslora, and where dropout applies; autograd gives the gradients. What is
not: the frozen base, a small QuantLinear-shaped module (`infeatures`, `outfeatures`, what
peft's GPTQ path reads) whose forward is x @ dequantize(...) + bias with gradscope's own
dequantization (peft has none, and that one is checked bit for bit by the dequant kind); the
dropout draw, replaced by the case's mask with nn.Dropout's rescale by 1 / (1 - p) so that every
implementation sees the same elements dropped; the MLP composition down(silu(gate(x)) * up(x))
in x's dtype as Hugging Face's LlamaMLP, since peft has no fused MLP. peft has no dequantize:
dequant cases exit 2 naming the missing operator.
"""
import peft
import torch
from peft.tuners.lora import LoraConfig
from peft.tuners.lora.gptq import GPTQLoraLinear

import gradscope
from gradscope.adapters._case_dropout import MaskDropout

NAMESPACE = "peft"
_ADAPTER = "default"


class _GptqBase(torch.nn.Module):
    """The frozen GPTQ base in the shape peft's GPTQ path expects of a QuantLinear."""

    def __init__(self, qweight, qzeros, scales, g_idx, bias, bits, zero_format):
        super().__init__()
        self.infeatures, self.outfeatures = g_idx.shape[0], scales.shape[1]
        self.qweight, self.qzeros, self.scales, self.g_idx = qweight, qzeros, scales, g_idx
        self.bias, self.bits, self.zero_format = bias, bits, zero_format

    def forward(self, x):
        w = torch.ops.gradscope.dequantize(self.qweight, self.qzeros, self.scales, self.g_idx,
                                           self.bits, self.zero_format, x.dtype)
        y = x @ w
        return y if self.bias is None else y + self.bias


def _peft_linear(x, proj, bits, zero_format, lora_alpha, use_rslora, mask, p):
    qweight, qzeros, scales, g_idx, lora_a, lora_b = proj[:6]
    bias = proj[6] if len(proj) == 7 else None
    base = _GptqBase(qweight, qzeros, scales, g_idx, bias, bits, zero_format)
    r = lora_a.shape[0]
    config = LoraConfig(r=r, lora_alpha=lora_alpha, use_rslora=use_rslora,
                        lora_dropout=p if mask is not None else 0.0)
    layer = GPTQLoraLinear(base, _ADAPTER, config=config, r=r, lora_alpha=lora_alpha)
    if mask is not None:
        layer.lora_dropout[_ADAPTER] = MaskDropout(mask, p)
    # The case's adapters (leaves whose .grad gradscope reads) in place of peft's own.
    weights = {f"lora_A.{_ADAPTER}.weight": lora_a, f"lora_B.{_ADAPTER}.weight": lora_b}
    return torch.func.functional_call(layer, weights, (x,))


def lora_w(x, proj, bits, zero_format, lora_alpha, use_rslora, dropout_mask=None, dropout_p=0.0):
    return _peft_linear(x, proj, bits, zero_format, lora_alpha, use_rslora, dropout_mask,
                        dropout_p)


def lora_qkv(x, q, k, v, bits, zero_format, lora_alpha, use_rslora, dropout_mask=None,
             dropout_p=0.0):
    return [_peft_linear(x, p, bits, zero_format, lora_alpha, use_rslora, dropout_mask, dropout_p)
            for p in (q, k, v)]


def lora_mlp(x, gate, up, down, bits, zero_format, lora_alpha, use_rslora, dropout_x=None,
             dropout_h=None, dropout_p=0.0):
    args = (bits, zero_format, lora_alpha, use_rslora)
    e = _peft_linear(x, gate, *args, dropout_x, dropout_p)
    g = _peft_linear(x, up, *args, dropout_x, dropout_p)
    h = torch.nn.functional.silu(e) * g
    return _peft_linear(h, down, *args, dropout_h, dropout_p)


VERSION = peft.__version__
_library = torch.library.Library(NAMESPACE, "DEF")
gradscope.define_ops(_library, ["lora_w", "lora_qkv", "lora_mlp"])
for _name, _fn in (("lora_w", lora_w), ("lora_qkv", lora_qkv), ("lora_mlp", lora_mlp)):
    _library.impl(_name, _fn, "CompositeImplicitAutograd")

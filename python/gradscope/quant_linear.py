"""A GPTQ QuantLinear with the module and buffer names GPTQ packages and peft use, over
gradscope's own dequantization (torch.ops.gradscope.dequantize; docs/gptq-format.md).

For modules under test where no GPTQ package installs beside the pinned torch (docs/python.md,
"check_module"): peft's GPTQLoraLinear wraps it as it wraps a GPTQModel QuantLinear, and
check_module reads the same names (qweight, qzeros, scales, g_idx, bias; bits, group_size).
"""
from __future__ import annotations

from typing import Optional

import torch


class QuantLinear(torch.nn.Module):
    """y = x @ dequantize(qweight, qzeros, scales, g_idx) + bias, frozen.

    Buffers: qweight int32 [in * bits / 32, out], qzeros int32 [groups, out * bits / 32],
    scales [groups, out] (fp16 or bf16), g_idx int32 [in], bias [out] or None. `zero_format`
    is how qzeros store zero points: "gptq" (v1, zero - 1) or "gptq_v2".
    """

    def __init__(self, bits: int, group_size: int, in_features: int, out_features: int,
                 bias: bool = False, zero_format: str = "gptq", desc_act: bool = False,
                 scales_dtype: torch.dtype = torch.float16,
                 device: Optional[torch.device] = None) -> None:
        super().__init__()
        if bits not in (2, 3, 4, 8):
            raise ValueError(f"QuantLinear: bits must be 2, 3, 4 or 8, got {bits}")
        if zero_format not in ("gptq", "gptq_v2"):
            raise ValueError(f"QuantLinear: zero_format must be 'gptq' or 'gptq_v2', got "
                             f"{zero_format!r}")
        group = in_features if group_size == -1 else group_size
        if group <= 0 or in_features % group != 0:
            raise ValueError(f"QuantLinear: group_size {group_size} must divide in_features "
                             f"{in_features} (or be -1)")
        if (in_features * bits) % 32 != 0 or (out_features * bits) % 32 != 0:
            raise ValueError(f"QuantLinear: {in_features} x {out_features} does not pack into "
                             f"32-bit words at {bits} bits")
        groups = in_features // group
        self.bits, self.group_size, self.desc_act = bits, group_size, desc_act
        self.maxq = 2**bits - 1  # the largest code, as GPTQ QuantLinears name it
        self.zero_format = zero_format
        self.in_features = self.infeatures = in_features
        self.out_features = self.outfeatures = out_features
        self.register_buffer("qweight", torch.zeros(in_features * bits // 32, out_features,
                                                    dtype=torch.int32, device=device))
        self.register_buffer("qzeros", torch.zeros(groups, out_features * bits // 32,
                                                   dtype=torch.int32, device=device))
        self.register_buffer("scales", torch.ones(groups, out_features, dtype=scales_dtype,
                                                  device=device))
        self.register_buffer("g_idx", (torch.arange(in_features, device=device) // group).to(
            torch.int32))
        self.register_buffer("bias", torch.zeros(out_features, dtype=torch.float16, device=device)
                             if bias else None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = torch.ops.gradscope.dequantize(self.qweight, self.qzeros, self.scales, self.g_idx,
                                           self.bits, self.zero_format, x.dtype)
        y = x @ w
        return y if self.bias is None else y + self.bias.to(x.dtype)

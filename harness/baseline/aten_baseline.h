// The baseline: what peft on top of a plain torch QuantLinear computes, as unfused
// ATen ops in the case's dtypes (the base path in the activation dtype, the adapter path in
// the adapters' dtype), with autograd doing the backward. It shares no code
// with prod: its dequantization is tensor shifts and masks written here.
#pragma once

#include <ATen/core/Tensor.h>

#include "gradscope/decoder_layer.h"
#include "gradscope/gptq_format.h"
#include "gradscope/lora_ops.h"

namespace gradscope::baseline {

// W^T [K, N] in `dtype`: codes and zeros unpacked with int64 tensor shifts, scales and
// zeros gathered through g_idx, fp32 arithmetic, one rounding.
at::Tensor dequantize(const GptqWeight& weight, at::ScalarType dtype);

// result = x W^T + b in x's dtype; lora = (dropout(x) A^T) B^T * scaling in the adapters'
// dtype; return result + lora rounded to x's dtype.
at::Tensor lora_linear(const at::Tensor& x, const LoraProjection& proj, const LoraDropout& dropout);

// down(silu(gate(x)) * up(x)) with at::silu.
at::Tensor lora_mlp(const at::Tensor& x, const LoraProjection& gate, const LoraProjection& up,
                    const LoraProjection& down, const LoraDropout& dropout_x,
                    const LoraDropout& dropout_h);

// The decoder layer of gradscope/decoder_layer.h with the unfused LoRA ops above, its own
// RMSNorm and RoPE, key/value heads repeated for attention (ATen's, as in prod).
at::Tensor decoder_layer(const at::Tensor& x, const DecoderLayer& layer);

}  // namespace gradscope::baseline

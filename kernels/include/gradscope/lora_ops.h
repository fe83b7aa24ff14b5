// Fused LoRA autograd ops over GPTQ base weights. The base weight is dequantized
// just in time in forward and again in backward: no dense weight is kept between
// them, and at most one dense weight is alive at a time. Gradients flow to x and
// to every lora_A / lora_B; the packed weights and bias are frozen and never modified.
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

#include "gradscope/gptq_format.h"

namespace gradscope {

// A frozen GPTQ projection with its LoRA adapter (peft layouts).
struct LoraProjection {
  GptqWeight base;     // packed W^T [in, out]
  at::Tensor bias;     // optional [out]
  at::Tensor lora_A;   // [r, in]
  at::Tensor lora_B;   // [out, r]
  double scaling = 1;  // alpha / r, or alpha / sqrt(r) for rsLoRA
};

// Dropout on an adapter's input: X_d = X * mask / (1 - p). `mask` is a bool tensor
// with one element per input element; it is unused (may be undefined) when p == 0.
struct LoraDropout {
  double p = 0;
  at::Tensor mask;
};

double lora_scaling(double alpha, int64_t rank, bool rslora);

// Y = X W^T + b + s (X_d A^T) B^T for x [..., in] (2-D or 3-D); returns [..., out].
at::Tensor lora_w(const at::Tensor& x, const LoraProjection& proj, const LoraDropout& dropout = {});

// q, k, v projections of one input (k and v may be narrower: grouped-query attention).
// One dropout mask on x is shared by the three adapters.
std::vector<at::Tensor> lora_qkv(const at::Tensor& x, const LoraProjection& q,
                                 const LoraProjection& k, const LoraProjection& v,
                                 const LoraDropout& dropout = {});

// SwiGLU MLP: down(silu(gate(x)) * up(x)). `dropout_x` masks the gate and up adapter
// input (x), `dropout_h` the down adapter input (h). Saves x, e = gate(x), g = up(x).
at::Tensor lora_mlp(const at::Tensor& x, const LoraProjection& gate, const LoraProjection& up,
                    const LoraProjection& down, const LoraDropout& dropout_x = {},
                    const LoraDropout& dropout_h = {});

}  // namespace gradscope

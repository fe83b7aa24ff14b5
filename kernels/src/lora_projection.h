// Internal: the math of one LoRA projection, shared by the three fused ops, and how
// a projection's frozen state rides in an autograd context.
#pragma once

#include <torch/csrc/autograd/custom_function.h>

#include <string>

#include "gradscope/lora_ops.h"

namespace gradscope::detail {

using torch::autograd::AutogradContext;

// The frozen part of a projection (everything but the adapter weights).
struct FrozenProjection {
  GptqWeight base;
  at::Tensor bias;
  double scaling;
};

FrozenProjection frozen_part(const LoraProjection& proj);
void save_frozen(AutogradContext* ctx, const std::string& key, const FrozenProjection& frozen);
FrozenProjection load_frozen(AutogradContext* ctx, const std::string& key);
void save_dropout(AutogradContext* ctx, const std::string& key, const LoraDropout& dropout);
LoraDropout load_dropout(AutogradContext* ctx, const std::string& key);

// Checks one projection against its input x [..., in]; messages name op and projection.
void validate_projection(const char* op, const char* name, const at::Tensor& x,
                         const LoraProjection& proj);
void validate_dropout(const char* op, const char* name, const at::Tensor& x, const LoraDropout& d);

// x [..., in] as [M, in].
at::Tensor rows(const at::Tensor& x);
// An op's output as handed back (the output-dtype fault hands back fp32).
at::Tensor as_output(const at::Tensor& y);

// The dtype of the adapter path (X_d A^T, its product with B, dA, dB): the wider of x's and
// the adapters', as peft computes it (docs/lora-math.md). fp32 adapters under fp16/bf16
// activations never pass through a half-precision intermediate that could overflow.
at::ScalarType adapter_dtype(at::ScalarType x, at::ScalarType adapters);

struct ProjectionOutput {
  at::Tensor y;   // [M, out], x's dtype
  at::Tensor xa;  // X_d A^T [M, r] in the adapter path's dtype, kept for dB
};
// Y = X W^T + b + s (X_d A^T) B^T with X_d = X * mask / (1 - p); the dense W^T lives only
// inside this call.
ProjectionOutput projection_forward(const at::Tensor& x2, const LoraDropout& dropout,
                                    const FrozenProjection& frozen, const at::Tensor& lora_a,
                                    const at::Tensor& lora_b);

struct ProjectionGrads {
  at::Tensor dx;  // dY W + s ((dY B) A) * mask / (1 - p); undefined unless asked for
  at::Tensor dA;  // s (dY B)^T X_d, in lora_A's dtype
  at::Tensor dB;  // s dY^T (X_d A^T), in lora_B's dtype
};
// Backward of projection_forward for dY [M, out]; re-dequantizes W. x2 is the adapter's
// input before dropout.
ProjectionGrads projection_backward(const at::Tensor& dy2, const at::Tensor& x2,
                                    const LoraDropout& dropout, const at::Tensor& xa,
                                    const FrozenProjection& frozen, const at::Tensor& lora_a,
                                    const at::Tensor& lora_b, bool need_dx);

}  // namespace gradscope::detail

// Internal: the LoRA adapter path in fp32 beside fp16/bf16 activations on CUDA, through the
// kernels of lora_adapter_cuda.cu (ATen glue in lora_adapter_path.cpp). The ATen path in
// lora_projection.cpp computes the same quantities everywhere else.
#pragma once

#include <ATen/core/Tensor.h>

namespace gradscope::detail {

// Whether the kernels take a projection: x on CUDA in fp16 or bf16 with fp32 adapter math,
// rank <= 32 (cuda::kAdapterMaxRank), in and out features multiples of 8, a CUDA build, and
// GRADSCOPE_ADAPTER_KERNELS not "off" (lora_adapter_path.cpp).
bool adapter_kernels_apply(const at::Tensor& x2, at::ScalarType adapter_dtype, int64_t rank,
                           int64_t out_features);

// Half activations [tokens, features] as the kernels read them: x, or with a dropout mask
// (bool, x's shape) x * mask * keep_scale.
struct HalfRows {
  at::Tensor x;
  at::Tensor mask = {};  // undefined: no dropout
  double keep_scale = 1.0;
};

// An fp32 adapter weight and which of its dimensions is the rank: lora_A [r, in] is
// rank-major, lora_B [out, r] is not.
struct AdapterWeight {
  at::Tensor w;
  bool rank_major;
};

// X W^T over the rank: x A^T or dY B, [tokens, r] fp32.
at::Tensor rows_times_adapter(const HalfRows& x, const AdapterWeight& w);

// y += alpha * mask * (P W), in place, rounded once to y's dtype. `mask` may be undefined.
struct LowRankUpdate {
  at::Tensor p;  // [tokens, r] fp32
  AdapterWeight w;
  at::Tensor mask;
  double alpha;
};
void add_low_rank(at::Tensor& y, const LowRankUpdate& update);

// alpha * P^T x over the tokens: [r, features] if rank_major, else [features, r]; fp32.
struct OuterProduct {
  at::Tensor p;  // [tokens, r] fp32
  double alpha;
  bool rank_major;
};
at::Tensor outer_product_sum(const HalfRows& x, const OuterProduct& product);

}  // namespace gradscope::detail

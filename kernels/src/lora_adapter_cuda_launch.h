// Launch interface of the CUDA kernels of the LoRA adapter path in fp32 beside fp16 or bf16
// activations: raw pointers only, so the .cu file never parses torch headers. The math and
// why these kernels exist: docs/lora-math.md (Precision) and docs/performance.md.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "dequant_cuda_launch.h"  // ElementType

namespace gradscope::cuda {

// The largest rank the kernels take; a larger one stays on the ATen path. At rank 64 the
// kernels' fp32 work per element makes the fused ops no faster than the ATen path, while at
// ranks 16 and 32 they are faster (docs/performance.md, "Fused LoRA ops").
constexpr int kAdapterMaxRank = 32;

// An fp32 matrix W(j, k), j < rank, k < features, read at data[j * stride_j + k * stride_k]:
// lora_A [r, in] is W with strides (in, 1); lora_B [out, r] read as W(j, o) = B[o, j] has
// strides (1, r).
struct AdapterMatrix {
  const float* data;
  int64_t stride_j;
  int64_t stride_k;
};

// Activations [tokens, features] in fp16 or bf16, contiguous, 16-byte aligned, features a
// multiple of 8; with a dropout mask (bool, same shape, contiguous) the kernels read
// x * mask * keep_scale, each product rounded once in fp32, as the ATen path computes it.
struct AdapterRows {
  const void* data;
  ElementType type;
  int64_t tokens;
  int64_t features;
  const uint8_t* mask;  // null: no dropout
  float keep_scale;     // 1 / (1 - p)
};

// P[t, j] = alpha * sum_k x[t, k] W(j, k): x A^T and dY B. `out` [tokens, rank] fp32.
struct RowsTimesAdapter {
  AdapterRows x;
  AdapterMatrix w;
  int rank;
  float alpha;
  float* out;
  float* workspace;  // rows_times_adapter_workspace(...) floats
};
int64_t rows_times_adapter_workspace(int64_t tokens, int64_t features, int rank);
cudaError_t launch_rows_times_adapter(const RowsTimesAdapter& args, cudaStream_t stream);

// y[t, k] = round(y[t, k] + alpha * mask[t, k] * sum_j P[t, j] W(j, k)), in place, one
// rounding: the adapter term of the forward output and of dX.
struct AddLowRank {
  void* y;  // [tokens, features], fp16 or bf16, contiguous, 16-byte aligned
  ElementType type;
  int64_t tokens;
  int64_t features;
  const float* p;  // [tokens, rank]
  AdapterMatrix w;
  int rank;
  const uint8_t* mask;  // null: no mask
  float alpha;
};
cudaError_t launch_add_low_rank(const AddLowRank& args, cudaStream_t stream);

// O(j, k) = alpha * sum_t P[t, j] x[t, k], written at out[j * out_stride_j + k * out_stride_k]
// (not accumulated): dA = s (dY B)^T X_d and, with x = dY, P = X_d A^T and strides (1, r),
// dB = s dY^T (X_d A^T).
struct OuterProductSum {
  AdapterRows x;
  const float* p;  // [tokens, rank]
  int rank;
  float alpha;
  float* out;
  int64_t out_stride_j;
  int64_t out_stride_k;
  float* workspace;  // outer_product_sum_workspace(...) floats
};
int64_t outer_product_sum_workspace(int64_t tokens, int64_t features, int rank);
cudaError_t launch_outer_product_sum(const OuterProductSum& args, cudaStream_t stream);

}  // namespace gradscope::cuda

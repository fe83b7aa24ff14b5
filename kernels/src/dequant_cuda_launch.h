// Launch interface of the CUDA dequant kernel: raw pointers only, so the .cu
// file never parses torch headers.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace gradscope::cuda {

enum class ElementType { kFloat32, kFloat16, kBFloat16 };

struct DequantLaunch {
  const uint32_t* qweight;  // [K * bits / 32, N]
  const uint32_t* qzeros;   // [G, N * bits / 32]
  const void* scales;       // [G, N], scale_type
  const int32_t* g_idx;     // [K]
  void* out;                // [K, N] or [N, K], out_type
  int64_t in_features;
  int64_t out_features;
  int bits;
  int zero_offset;  // 1 for v1 ("gptq"), 0 for v2
  ElementType scale_type;
  ElementType out_type;
  bool out_in_layout;  // write W [N, K] instead of W^T [K, N]
  int64_t groups;      // G, rows of scales
  int fault;           // dequant_faults::Mode (0: the correct decoder)
};

cudaError_t launch_dequant_gptq(const DequantLaunch& args, cudaStream_t stream);

}  // namespace gradscope::cuda

// Shared by the ATen glue of every CUDA kernel (built only with GRADSCOPE_WITH_CUDA).
#pragma once

#include <ATen/core/Tensor.h>

#include "dequant_cuda_launch.h"

namespace gradscope::detail {

// fp32, fp16 or bf16 (callers validate the dtype first).
inline cuda::ElementType element_type(at::ScalarType t) {
  switch (t) {
    case at::kFloat:
      return cuda::ElementType::kFloat32;
    case at::kHalf:
      return cuda::ElementType::kFloat16;
    default:
      return cuda::ElementType::kBFloat16;
  }
}

}  // namespace gradscope::detail

// Launch interface of the CUDA SwiGLU kernels: raw pointers only.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "dequant_cuda_launch.h"  // ElementType

namespace gradscope::cuda {

// `mode`: a swiglu_math::Mode (kCorrect unless a fault is injected).
cudaError_t launch_swiglu_forward(const void* e, const void* g, void* h, int64_t n,
                                  ElementType type, int mode, cudaStream_t stream);
cudaError_t launch_swiglu_backward(const void* dh, const void* e, const void* g, void* de, void* dg,
                                   int64_t n, ElementType type, int mode, cudaStream_t stream);

}  // namespace gradscope::cuda

// Element-wise SwiGLU forward and backward; fp32 arithmetic, one rounding per output.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "swiglu_cuda_launch.h"
#include "swiglu_math.h"

namespace gradscope::cuda {
namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ float load(const float* p, int64_t i) {
  return p[i];
}
__device__ __forceinline__ float load(const __half* p, int64_t i) {
  return __half2float(p[i]);
}
__device__ __forceinline__ float load(const __nv_bfloat16* p, int64_t i) {
  return __bfloat162float(p[i]);
}
__device__ __forceinline__ void store(float* p, int64_t i, float v) {
  p[i] = v;
}
__device__ __forceinline__ void store(__half* p, int64_t i, float v) {
  p[i] = __float2half_rn(v);
}
__device__ __forceinline__ void store(__nv_bfloat16* p, int64_t i, float v) {
  p[i] = __float2bfloat16_rn(v);
}
// The value as the activation dtype holds it.
template <typename T>
__device__ __forceinline__ float round_to(float v) {
  T t;
  store(&t, 0, v);
  return load(&t, 0);
}

template <typename T>
__global__ void swiglu_forward_kernel(const T* __restrict__ e, const T* __restrict__ g,
                                      T* __restrict__ h, int64_t n, int mode) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float ev = load(e, i);
    const float silu = round_to<T>(ev * swiglu_math::sigmoid(ev, mode));
    store(h, i, silu * load(g, i));
  }
}

template <typename T>
__global__ void swiglu_backward_kernel(const T* __restrict__ dh, const T* __restrict__ e,
                                       const T* __restrict__ g, T* __restrict__ de,
                                       T* __restrict__ dg, int64_t n, int mode) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const auto grad = swiglu_math::backward(load(dh, i), load(e, i), load(g, i), mode);
    store(de, i, grad.de);
    store(dg, i, grad.dg);
  }
}

unsigned blocks_for(int64_t n) {
  const int64_t b = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(b < 65535 * 8 ? b : 65535 * 8);
}

template <typename T>
void forward_typed(const void* e, const void* g, void* h, int64_t n, int mode, cudaStream_t s) {
  swiglu_forward_kernel<T><<<blocks_for(n), kThreads, 0, s>>>(
      static_cast<const T*>(e), static_cast<const T*>(g), static_cast<T*>(h), n, mode);
}

template <typename T>
void backward_typed(const void* dh, const void* e, const void* g, void* de, void* dg, int64_t n,
                    int mode, cudaStream_t s) {
  swiglu_backward_kernel<T><<<blocks_for(n), kThreads, 0, s>>>(
      static_cast<const T*>(dh), static_cast<const T*>(e), static_cast<const T*>(g),
      static_cast<T*>(de), static_cast<T*>(dg), n, mode);
}

}  // namespace

cudaError_t launch_swiglu_forward(const void* e, const void* g, void* h, int64_t n,
                                  ElementType type, int mode, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  switch (type) {
    case ElementType::kFloat32:
      forward_typed<float>(e, g, h, n, mode, stream);
      break;
    case ElementType::kFloat16:
      forward_typed<__half>(e, g, h, n, mode, stream);
      break;
    case ElementType::kBFloat16:
      forward_typed<__nv_bfloat16>(e, g, h, n, mode, stream);
      break;
  }
  return cudaGetLastError();
}

cudaError_t launch_swiglu_backward(const void* dh, const void* e, const void* g, void* de, void* dg,
                                   int64_t n, ElementType type, int mode, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  switch (type) {
    case ElementType::kFloat32:
      backward_typed<float>(dh, e, g, de, dg, n, mode, stream);
      break;
    case ElementType::kFloat16:
      backward_typed<__half>(dh, e, g, de, dg, n, mode, stream);
      break;
    case ElementType::kBFloat16:
      backward_typed<__nv_bfloat16>(dh, e, g, de, dg, n, mode, stream);
      break;
  }
  return cudaGetLastError();
}

}  // namespace gradscope::cuda

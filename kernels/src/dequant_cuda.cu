// CUDA dequantization. One thread owns one column of a 32-row block: it loads
// the block's `bits` packed words once and writes 32 outputs; neighbouring
// threads own neighbouring columns, so loads and row-major stores coalesce.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "dequant_cuda_launch.h"
#include "dequant_fault_modes.h"
#include "packed_bits.h"

namespace gradscope::cuda {
namespace {

constexpr int kThreads = 128;
constexpr int kRowsPerBlock = 32;

__device__ __forceinline__ float to_float(__half v) {
  return __half2float(v);
}
__device__ __forceinline__ float to_float(__nv_bfloat16 v) {
  return __bfloat162float(v);
}

template <typename Out>
__device__ __forceinline__ Out from_float(float v);
template <>
__device__ __forceinline__ float from_float<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ __half from_float<__half>(float v) {
  return __float2half_rn(v);
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

template <int kBits, typename Out, typename Scale>
__global__ void dequant_gptq_kernel(const uint32_t* __restrict__ qweight,
                                    const uint32_t* __restrict__ qzeros,
                                    const Scale* __restrict__ scales,
                                    const int32_t* __restrict__ g_idx, Out* __restrict__ out,
                                    int64_t K, int64_t N, int64_t G, bool v1, bool out_in_layout,
                                    int fault) {
  // The block's 32 groups first: every thread needs them, and with them in shared memory
  // the per-row scale and zero loads below no longer wait on a g_idx load each.
  __shared__ int64_t groups[kRowsPerBlock];
  const int64_t row0 = static_cast<int64_t>(blockIdx.y) * kRowsPerBlock;
  if (threadIdx.x < kRowsPerBlock) {
    const int64_t k = row0 + threadIdx.x;
    groups[threadIdx.x] = k < K ? dequant_faults::group(k, K, G, g_idx, fault) : 0;
  }
  __syncthreads();
  const int64_t n = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (n >= N) return;
  const int64_t total_words = K * kBits / 32;
  uint32_t words[kBits + 1];
#pragma unroll
  for (int i = 0; i < kBits + 1; ++i) {
    const int64_t w = row0 / 32 * kBits + i;
    words[i] = (i < kBits && w < total_words) ? qweight[w * N + n] : 0u;
  }
  const int64_t zero_words = N * kBits / 32;
  const auto zero_pos = packed_bits::locate(n, kBits);
  const bool zero_two = packed_bits::straddles(zero_pos.shift, kBits);
  const int zero_offset = dequant_faults::zero_offset(v1, fault);
  const int64_t scale_n = dequant_faults::scale_column(n, N, fault);
  const int rows = static_cast<int>(K - row0 < kRowsPerBlock ? K - row0 : kRowsPerBlock);
#pragma unroll
  for (int j = 0; j < kRowsPerBlock; ++j) {
    if (j >= rows) break;
    const int64_t k = row0 + j;
    const int bit = (j * kBits & ~31) + dequant_faults::shift(j * kBits & 31, fault);
    const uint32_t high = dequant_faults::keep_high_word(fault) ? words[(bit >> 5) + 1] : 0u;
    const uint32_t code = packed_bits::read_field(words[bit >> 5], high, bit & 31, kBits);
    const int64_t g = groups[j];
    const uint32_t* zrow = qzeros + g * zero_words;
    const uint32_t zero_field = packed_bits::read_field(
        __ldg(zrow + zero_pos.word), zero_two ? __ldg(zrow + zero_pos.word + 1) : 0u,
        zero_pos.shift, kBits);
    const int zero = static_cast<int>(zero_field) + zero_offset;
    const float value =
        to_float(scales[g * N + scale_n]) * static_cast<float>(static_cast<int>(code) - zero);
    out[out_in_layout ? n * K + k : k * N + n] = from_float<Out>(value);
  }
}

template <int kBits, typename Out, typename Scale>
void launch_typed(const DequantLaunch& a, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>((a.out_features + kThreads - 1) / kThreads),
                  static_cast<unsigned>((a.in_features + kRowsPerBlock - 1) / kRowsPerBlock));
  dequant_gptq_kernel<kBits, Out, Scale><<<grid, kThreads, 0, stream>>>(
      a.qweight, a.qzeros, static_cast<const Scale*>(a.scales), a.g_idx, static_cast<Out*>(a.out),
      a.in_features, a.out_features, a.groups, a.zero_offset == 1, a.out_in_layout, a.fault);
}

template <int kBits, typename Out>
void launch_scale(const DequantLaunch& a, cudaStream_t stream) {
  if (a.scale_type == ElementType::kFloat16) {
    launch_typed<kBits, Out, __half>(a, stream);
  } else {
    launch_typed<kBits, Out, __nv_bfloat16>(a, stream);
  }
}

template <int kBits>
void launch_out(const DequantLaunch& a, cudaStream_t stream) {
  switch (a.out_type) {
    case ElementType::kFloat32:
      launch_scale<kBits, float>(a, stream);
      break;
    case ElementType::kFloat16:
      launch_scale<kBits, __half>(a, stream);
      break;
    case ElementType::kBFloat16:
      launch_scale<kBits, __nv_bfloat16>(a, stream);
      break;
  }
}

}  // namespace

cudaError_t launch_dequant_gptq(const DequantLaunch& a, cudaStream_t stream) {
  if (a.in_features == 0 || a.out_features == 0) return cudaSuccess;
  if (a.in_features / kRowsPerBlock >= 65535) return cudaErrorInvalidConfiguration;
  switch (a.bits) {
    case 2:
      launch_out<2>(a, stream);
      break;
    case 3:
      launch_out<3>(a, stream);
      break;
    case 4:
      launch_out<4>(a, stream);
      break;
    case 8:
      launch_out<8>(a, stream);
      break;
    default:
      return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

}  // namespace gradscope::cuda

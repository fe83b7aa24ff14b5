// CUDA dequantization. One thread owns four neighbouring columns of a 32-row block: it
// loads the block's `bits` packed words of each once (16-byte vectors) and writes 128
// outputs (8- or 16-byte vectors); neighbouring threads own neighbouring columns, so loads
// and row-major stores coalesce.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "dequant_cuda_launch.h"
#include "dequant_fault_modes.h"
#include "packed_bits.h"

namespace gradscope::cuda {
namespace {

constexpr int kThreads = 128;
constexpr int kRowsPerBlock = 32;
constexpr int kCols = 4;  // N is a multiple of 4 at every width (qzeros packing)

// Four neighbouring outputs rounded once each and stored with one vector store.
template <typename Out>
struct OutQuad;
template <>
struct OutQuad<float> {
  static __device__ __forceinline__ void store(float* p, const float (&v)[kCols]) {
    *reinterpret_cast<float4*>(p) = make_float4(v[0], v[1], v[2], v[3]);
  }
  static __device__ __forceinline__ float one(float v) { return v; }
};
template <>
struct OutQuad<__half> {
  static __device__ __forceinline__ void store(__half* p, const float (&v)[kCols]) {
    const __half2 a = __floats2half2_rn(v[0], v[1]), b = __floats2half2_rn(v[2], v[3]);
    uint2 bits;
    bits.x = *reinterpret_cast<const uint32_t*>(&a);
    bits.y = *reinterpret_cast<const uint32_t*>(&b);
    *reinterpret_cast<uint2*>(p) = bits;
  }
  static __device__ __forceinline__ __half one(float v) { return __float2half_rn(v); }
};
template <>
struct OutQuad<__nv_bfloat16> {
  static __device__ __forceinline__ void store(__nv_bfloat16* p, const float (&v)[kCols]) {
    const __nv_bfloat162 a = __floats2bfloat162_rn(v[0], v[1]),
                         b = __floats2bfloat162_rn(v[2], v[3]);
    uint2 bits;
    bits.x = *reinterpret_cast<const uint32_t*>(&a);
    bits.y = *reinterpret_cast<const uint32_t*>(&b);
    *reinterpret_cast<uint2*>(p) = bits;
  }
  static __device__ __forceinline__ __nv_bfloat16 one(float v) { return __float2bfloat16_rn(v); }
};

// A group's zero points and scales for a thread's four columns, as loaded: one 8-byte
// vector of scales and the packed zero word(s) holding the four fields (one word at 2, 4
// and 8 bits; at 3 bits the 12 bits may continue into the next word).
struct GroupWords {
  uint2 scales;
  uint32_t zero_low, zero_high;
};

template <typename Scale>
__device__ __forceinline__ uint16_t scale_bits(const Scale* p) {
  return __ldg(reinterpret_cast<const unsigned short*>(p));
}
__device__ __forceinline__ float scale_from_bits(uint16_t bits, __half) {
  return __half2float(__ushort_as_half(bits));
}
__device__ __forceinline__ float scale_from_bits(uint16_t bits, __nv_bfloat16) {
  return __uint_as_float(static_cast<uint32_t>(bits) << 16);
}

// Issues the loads of group g's parameters for columns n0..n0+3; decoding is left to
// decode_group so that callers can issue several groups' loads before the first use.
template <int kBits, typename Scale>
__device__ __forceinline__ GroupWords load_group(const uint32_t* __restrict__ qzeros,
                                                 const Scale* __restrict__ scales, int64_t g,
                                                 int64_t n0, int64_t N, int zero_shift, int fault) {
  const uint32_t* zrow = qzeros + g * (N * kBits / 32) + n0 * kBits / 32;
  const Scale* srow = scales + g * N;
  GroupWords w;
  w.zero_low = __ldg(zrow);
  w.zero_high = kBits == 3 && zero_shift + kCols * kBits > 32 ? __ldg(zrow + 1) : 0u;
  if (fault == dequant_faults::kScalesWrongColumn) {
    uint16_t b[kCols];
#pragma unroll
    for (int c = 0; c < kCols; ++c)
      b[c] = scale_bits(srow + dequant_faults::scale_column(n0 + c, N, fault));
    w.scales = make_uint2(b[0] | static_cast<uint32_t>(b[1]) << 16,
                          b[2] | static_cast<uint32_t>(b[3]) << 16);
  } else {
    w.scales = __ldg(reinterpret_cast<const uint2*>(srow + n0));  // 8-byte aligned: host check
  }
  return w;
}

template <int kBits, typename Scale>
__device__ __forceinline__ void decode_group(const GroupWords& w, int zero_shift, int zero_offset,
                                             int (&zero)[kCols], float (&scale)[kCols]) {
  const uint64_t fields = w.zero_low | static_cast<uint64_t>(w.zero_high) << 32;
  const uint32_t s[kCols] = {w.scales.x & 0xffffu, w.scales.x >> 16, w.scales.y & 0xffffu,
                             w.scales.y >> 16};
#pragma unroll
  for (int c = 0; c < kCols; ++c) {
    zero[c] =
        static_cast<int>(fields >> (zero_shift + c * kBits) & ((1u << kBits) - 1u)) + zero_offset;
    scale[c] = scale_from_bits(static_cast<uint16_t>(s[c]), Scale());
  }
}

// One thread owns four neighbouring columns of a 32-row block: the per-row work that does
// not depend on the column (group, bit position) is done once for all four. Without
// act-order a block's 32 rows lie in one or two groups, and a group's parameters are loaded
// when the row's group differs from the previous row's. With act-order nearly every row
// has its own group, and loading on change serialised 32 round trips to L2 per thread; such
// blocks load the groups of eight rows at a time before decoding any of them.
template <int kBits, typename Out, typename Scale>
__global__ void dequant_gptq_kernel(const uint32_t* __restrict__ qweight,
                                    const uint32_t* __restrict__ qzeros,
                                    const Scale* __restrict__ scales,
                                    const int32_t* __restrict__ g_idx, Out* __restrict__ out,
                                    int64_t K, int64_t N, int64_t G, bool v1, bool out_in_layout,
                                    int fault) {
  constexpr int kRowsPerBatch = 8;
  // The block's 32 groups first: every thread needs them, and with them in shared memory
  // the per-row scale and zero loads below no longer wait on a g_idx load each.
  __shared__ int32_t groups[kRowsPerBlock];
  const int64_t row0 = static_cast<int64_t>(blockIdx.y) * kRowsPerBlock;
  const int rows = static_cast<int>(K - row0 < kRowsPerBlock ? K - row0 : kRowsPerBlock);
  if (threadIdx.x < kRowsPerBlock) {
    const int64_t k = row0 + threadIdx.x;
    groups[threadIdx.x] =
        k < K ? static_cast<int32_t>(dequant_faults::group(k, K, G, g_idx, fault)) : 0;
  }
  __syncthreads();
  // Block-uniform: how many times the group changes between neighbouring rows.
  const int group_changes =
      __syncthreads_count(threadIdx.x > 0 && static_cast<int>(threadIdx.x) < rows &&
                          groups[threadIdx.x] != groups[threadIdx.x - 1]);
  const int64_t n0 = (static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x) * kCols;
  if (n0 >= N) return;
  const int64_t total_words = K * kBits / 32;
  uint32_t words[kCols][kBits + 1];
#pragma unroll
  for (int i = 0; i < kBits + 1; ++i) {
    const int64_t w = row0 / 32 * kBits + i;
    const uint4 quad = (i < kBits && w < total_words)
                           ? *reinterpret_cast<const uint4*>(qweight + w * N + n0)
                           : make_uint4(0u, 0u, 0u, 0u);
    words[0][i] = quad.x;
    words[1][i] = quad.y;
    words[2][i] = quad.z;
    words[3][i] = quad.w;
  }
  const int zero_shift = packed_bits::locate(n0, kBits).shift;
  const int zero_offset = dequant_faults::zero_offset(v1, fault);
  const bool keep_high = dequant_faults::keep_high_word(fault);
  const auto emit_row = [&](int j, const int(&zero)[kCols], const float(&scale)[kCols]) {
    const int64_t k = row0 + j;
    const int bit = (j * kBits & ~31) + dequant_faults::shift(j * kBits & 31, fault);
    float value[kCols];
#pragma unroll
    for (int c = 0; c < kCols; ++c) {
      const uint32_t high = keep_high ? words[c][(bit >> 5) + 1] : 0u;
      const uint32_t code = packed_bits::read_field(words[c][bit >> 5], high, bit & 31, kBits);
      value[c] = scale[c] * static_cast<float>(static_cast<int>(code) - zero[c]);
    }
    if (out_in_layout) {
#pragma unroll
      for (int c = 0; c < kCols; ++c) out[(n0 + c) * K + k] = OutQuad<Out>::one(value[c]);
    } else {
      OutQuad<Out>::store(out + k * N + n0, value);
    }
  };
  int zero[kCols];
  float scale[kCols];
  if (group_changes <= 1) {
    int64_t cached_group = -1;
#pragma unroll
    for (int j = 0; j < kRowsPerBlock; ++j) {
      if (j >= rows) break;
      const int64_t g = groups[j];
      if (g != cached_group) {
        cached_group = g;
        decode_group<kBits, Scale>(load_group<kBits>(qzeros, scales, g, n0, N, zero_shift, fault),
                                   zero_shift, zero_offset, zero, scale);
      }
      emit_row(j, zero, scale);
    }
    return;
  }
#pragma unroll
  for (int j0 = 0; j0 < kRowsPerBlock; j0 += kRowsPerBatch) {
    if (j0 >= rows) break;
    GroupWords batch[kRowsPerBatch];  // rows past K read group 0, which exists
#pragma unroll
    for (int i = 0; i < kRowsPerBatch; ++i)
      batch[i] = load_group<kBits>(qzeros, scales, groups[j0 + i], n0, N, zero_shift, fault);
#pragma unroll
    for (int i = 0; i < kRowsPerBatch; ++i) {
      if (j0 + i >= rows) break;
      decode_group<kBits, Scale>(batch[i], zero_shift, zero_offset, zero, scale);
      emit_row(j0 + i, zero, scale);
    }
  }
}

template <int kBits, typename Out, typename Scale>
void launch_typed(const DequantLaunch& a, cudaStream_t stream) {
  const int64_t quads = (a.out_features + kCols - 1) / kCols;
  const dim3 grid(static_cast<unsigned>((quads + kThreads - 1) / kThreads),
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

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

// fp16 and bf16 scales are both 16-bit patterns, told apart by a flag that is uniform across
// the grid: one select per scale instead of a second instantiation of every kernel, which
// halves the file's compile time.
__device__ __forceinline__ float scale_from_bits(uint32_t bits, bool bf16) {
  return bf16 ? __uint_as_float(bits << 16)
              : __half2float(__ushort_as_half(static_cast<unsigned short>(bits)));
}

// Issues the loads of group g's parameters for columns n0..n0+3; decoding is left to
// decode_group so that callers can issue several groups' loads before the first use.
// `wrong_column` (the fault) takes columns n0+1..n0+4 instead, column N wrapping to 0
// (next_column): the four scales shifted by one, the last from the next quad.
template <int kBits>
__device__ __forceinline__ GroupWords load_group(const uint32_t* __restrict__ qzeros,
                                                 const uint16_t* __restrict__ scales, int64_t g,
                                                 int64_t n0, int64_t N, int zero_shift,
                                                 bool wrong_column, int64_t next_column) {
  const uint32_t* zrow = qzeros + g * (N * kBits / 32) + n0 * kBits / 32;
  const uint16_t* srow = scales + g * N;
  GroupWords w;
  w.zero_low = __ldg(zrow);
  w.zero_high = kBits == 3 && zero_shift + kCols * kBits > 32 ? __ldg(zrow + 1) : 0u;
  w.scales = __ldg(reinterpret_cast<const uint2*>(srow + n0));  // 8-byte aligned: host check
  if (wrong_column) {
    const uint32_t next = __ldg(reinterpret_cast<const unsigned short*>(srow + next_column));
    w.scales = make_uint2(__funnelshift_r(w.scales.x, w.scales.y, 16),
                          __funnelshift_r(w.scales.y, next, 16));
  }
  return w;
}

template <int kBits>
__device__ __forceinline__ void decode_group(const GroupWords& w, int zero_shift, int zero_offset,
                                             bool bf16_scales, int (&zero)[kCols],
                                             float (&scale)[kCols]) {
  const uint32_t s[kCols] = {w.scales.x & 0xffffu, w.scales.x >> 16, w.scales.y & 0xffffu,
                             w.scales.y >> 16};
#pragma unroll
  for (int c = 0; c < kCols; ++c) {
    uint32_t field;
    if constexpr (kBits == 3) {  // the four fields may continue into the next word
      const uint64_t fields = w.zero_low | static_cast<uint64_t>(w.zero_high) << 32;
      field = static_cast<uint32_t>(fields >> (zero_shift + c * kBits)) & 7u;
    } else {
      field = w.zero_low >> (zero_shift + c * kBits) & ((1u << kBits) - 1u);
    }
    zero[c] = static_cast<int>(field) + zero_offset;
    scale[c] = scale_from_bits(s[c], bf16_scales);
  }
}

// One thread owns four neighbouring columns of a 32-row block: the per-row work that does
// not depend on the column (group, bit position) is done once for all four. Without
// act-order a block's 32 rows lie in one or two groups, whose parameters are loaded once.
// With act-order nearly every row has its own group, and loading a row's group when it
// differed from the previous row's serialised 32 round trips to L2 per thread; such blocks
// load the groups of eight rows at a time before decoding any of them.
// Every row's bit position is a compile-time constant (the loops unroll and the faults
// never move it): the unrolled body stays small enough for the instruction cache, which a
// run-time shift per row had overflowed.
template <int kBits, bool kOutInLayout, typename Out>
__global__ void dequant_gptq_kernel(const uint32_t* __restrict__ qweight,
                                    const uint32_t* __restrict__ qzeros,
                                    const uint16_t* __restrict__ scales, bool bf16_scales,
                                    const int32_t* __restrict__ g_idx, Out* __restrict__ out,
                                    int64_t K, int64_t N, int64_t G, bool v1, int fault) {
  constexpr int kRowsPerBatch = 8;
  const int64_t row0 = static_cast<int64_t>(blockIdx.y) * kRowsPerBlock;
  const int rows = static_cast<int>(K - row0 < kRowsPerBlock ? K - row0 : kRowsPerBlock);
  const int64_t n0 = (static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x) * kCols;
  const bool active = n0 < N;
  // The block's words first, so that their latency overlaps the groups' below. The word
  // after the block is needed only by the shift fault, which reads every code one bit late.
  const bool shift_fault = fault == dequant_faults::kShiftOffByOne;
  const int64_t total_words = K * kBits / 32;
  uint32_t words[kCols][kBits + 1];
#pragma unroll
  for (int i = 0; i < kBits + 1; ++i) {
    const int64_t w = row0 / 32 * kBits + i;
    const uint4 quad = active && (i < kBits || shift_fault) && w < total_words
                           ? *reinterpret_cast<const uint4*>(qweight + w * N + n0)
                           : make_uint4(0u, 0u, 0u, 0u);
    words[0][i] = quad.x;
    words[1][i] = quad.y;
    words[2][i] = quad.z;
    words[3][i] = quad.w;
  }
  if (shift_fault) {
#pragma unroll
    for (int c = 0; c < kCols; ++c) {
#pragma unroll
      for (int i = 0; i < kBits; ++i)
        words[c][i] = __funnelshift_r(words[c][i], words[c][i + 1], 1);
    }
  }
  // The block's 32 groups, how often they change from one row to the next and at which row
  // first, from one warp: every thread needs them, and from shared memory the per-row scale
  // and zero loads below no longer wait on a g_idx load each.
  __shared__ int32_t groups[kRowsPerBlock];
  __shared__ int group_changes, first_change;
  if (threadIdx.x < kRowsPerBlock) {
    const int64_t k = row0 + threadIdx.x;
    const int32_t g =
        k < K ? static_cast<int32_t>(dequant_faults::group(k, K, G, g_idx, fault)) : 0;
    groups[threadIdx.x] = g;
    const int32_t previous = __shfl_up_sync(0xffffffffu, g, 1);
    const unsigned changed = __ballot_sync(0xffffffffu, threadIdx.x > 0 && k < K && g != previous);
    if (threadIdx.x == 0) {
      group_changes = __popc(changed);
      first_change = changed ? __ffs(static_cast<int>(changed)) - 1 : kRowsPerBlock;
    }
  }
  __syncthreads();
  if (!active) return;
  const int zero_shift = packed_bits::locate(n0, kBits).shift;
  const int zero_offset = dequant_faults::zero_offset(v1, fault);
  const bool wrong_column = fault == dequant_faults::kScalesWrongColumn;
  const int64_t next_column = n0 + kCols < N ? n0 + kCols : 0;
  const bool keep_high = dequant_faults::keep_high_word(fault);
  // Rows past K (a partial last block) are computed from zero words and not stored: a
  // predicated store, where a loop exit per row had multiplied the unrolled code.
  Out* row_out = kOutInLayout ? out + n0 * K + row0 : out + row0 * N + n0;
  const auto emit_row = [&](int j, const int(&zero)[kCols], const float(&scale)[kCols]) {
    const int word = j * kBits >> 5, shift = j * kBits & 31;
    float value[kCols];
#pragma unroll
    for (int c = 0; c < kCols; ++c) {
      const uint32_t high = keep_high ? words[c][word + 1] : 0u;
      const uint32_t code = packed_bits::read_field(words[c][word], high, shift, kBits);
      value[c] = scale[c] * static_cast<float>(static_cast<int>(code) - zero[c]);
    }
    if (j < rows) {
      if constexpr (kOutInLayout) {
#pragma unroll
        for (int c = 0; c < kCols; ++c) row_out[c * K + j] = OutQuad<Out>::one(value[c]);
      } else {
        OutQuad<Out>::store(row_out, value);
        row_out += N;
      }
    }
  };
  int zero[kCols];
  float scale[kCols];
  if (group_changes <= 1) {
    // At most two groups: the first row's up to the change, the last row's after it. Both
    // loaded up front, each row picks one.
    int second_zero[kCols];
    float second_scale[kCols];
    const GroupWords first =
        load_group<kBits>(qzeros, scales, groups[0], n0, N, zero_shift, wrong_column, next_column);
    const GroupWords second = load_group<kBits>(qzeros, scales, groups[rows - 1], n0, N, zero_shift,
                                                wrong_column, next_column);
    decode_group<kBits>(first, zero_shift, zero_offset, bf16_scales, zero, scale);
    decode_group<kBits>(second, zero_shift, zero_offset, bf16_scales, second_zero, second_scale);
    const int change = first_change;
#pragma unroll
    for (int j = 0; j < kRowsPerBlock; ++j) {
      if (j == change) {
#pragma unroll
        for (int c = 0; c < kCols; ++c) zero[c] = second_zero[c], scale[c] = second_scale[c];
      }
      emit_row(j, zero, scale);
    }
    return;
  }
#pragma unroll
  for (int j0 = 0; j0 < kRowsPerBlock; j0 += kRowsPerBatch) {
    GroupWords batch[kRowsPerBatch];  // rows past K read group 0, which exists
#pragma unroll
    for (int i = 0; i < kRowsPerBatch; ++i)
      batch[i] = load_group<kBits>(qzeros, scales, groups[j0 + i], n0, N, zero_shift, wrong_column,
                                   next_column);
#pragma unroll
    for (int i = 0; i < kRowsPerBatch; ++i) {
      decode_group<kBits>(batch[i], zero_shift, zero_offset, bf16_scales, zero, scale);
      emit_row(j0 + i, zero, scale);
    }
  }
}

template <int kBits, typename Out>
void launch_typed(const DequantLaunch& a, cudaStream_t stream) {
  const int64_t quads = (a.out_features + kCols - 1) / kCols;
  const dim3 grid(static_cast<unsigned>((quads + kThreads - 1) / kThreads),
                  static_cast<unsigned>((a.in_features + kRowsPerBlock - 1) / kRowsPerBlock));
  const auto kernel = a.out_in_layout ? dequant_gptq_kernel<kBits, true, Out>
                                      : dequant_gptq_kernel<kBits, false, Out>;
  kernel<<<grid, kThreads, 0, stream>>>(a.qweight, a.qzeros, static_cast<const uint16_t*>(a.scales),
                                        a.scale_type == ElementType::kBFloat16, a.g_idx,
                                        static_cast<Out*>(a.out), a.in_features, a.out_features,
                                        a.groups, a.zero_offset == 1, a.fault);
}

template <int kBits>
void launch_out(const DequantLaunch& a, cudaStream_t stream) {
  switch (a.out_type) {
    case ElementType::kFloat32:
      launch_typed<kBits, float>(a, stream);
      break;
    case ElementType::kFloat16:
      launch_typed<kBits, __half>(a, stream);
      break;
    case ElementType::kBFloat16:
      launch_typed<kBits, __nv_bfloat16>(a, stream);
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

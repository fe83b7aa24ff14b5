// CUDA dequantization. One thread owns eight neighbouring columns of a block of rows (16
// rows; 32 at 3 bits, whose 16 rows would end mid-word): it loads the block's packed words of
// each once (16-byte vectors) and writes each row's eight outputs with one 16-byte streaming
// store. Neighbouring threads own neighbouring columns, so loads and row-major stores
// coalesce. Why eight columns, 16 rows and streaming stores: docs/performance.md
// (dequantization), measured against a write-only fill of the same bytes.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

#include "dequant_cuda_launch.h"
#include "dequant_fault_modes.h"
#include "packed_bits.h"

namespace gradscope::cuda {
namespace {

constexpr int kThreads = 128;
constexpr int kCols = 8;  // N is a multiple of 8 except at 8 bits (a multiple of 4)
template <int kBits>
constexpr int kRowsPerBlock = kBits == 3   ? 32
                              : kBits == 8 ? 8
                                           : 16;  // whole packed words

// Eight neighbouring outputs rounded once each. Stored with streaming stores (evict-first):
// the output is not read again by this kernel, and without the hint wide stores can lose to
// narrow ones (docs/performance.md). `wide`: the row starts on a 16-byte boundary
// (N % 8 == 0), so one vector store; else two 8-byte ones. `second`: columns n0 + 4..7 exist (only
// 8-bit layers with N % 8 == 4 lack them, in the last thread of a row).
template <typename Out>
struct OutOct;
template <>
struct OutOct<float> {
  static __device__ __forceinline__ void store(float* p, const float (&v)[kCols], bool,
                                               bool second) {
    __stcs(reinterpret_cast<float4*>(p), make_float4(v[0], v[1], v[2], v[3]));
    if (second) __stcs(reinterpret_cast<float4*>(p + 4), make_float4(v[4], v[5], v[6], v[7]));
  }
  static __device__ __forceinline__ float one(float v) { return v; }
};
template <typename Out, typename Pair, Pair (*kRound)(float, float)>
struct OutOctHalf {
  static __device__ __forceinline__ void store(Out* p, const float (&v)[kCols], bool wide,
                                               bool second) {
    uint32_t bits[kCols / 2];
#pragma unroll
    for (int c = 0; c < kCols / 2; ++c) {
      const Pair pair = kRound(v[2 * c], v[2 * c + 1]);
      bits[c] = *reinterpret_cast<const uint32_t*>(&pair);
    }
    store_bits(p, bits, wide, second);
  }
  // Four pairs already rounded (the paired path).
  static __device__ __forceinline__ void store_bits(Out* p, const uint32_t (&bits)[kCols / 2],
                                                    bool wide, bool second) {
    if (wide) {
      __stcs(reinterpret_cast<uint4*>(p), make_uint4(bits[0], bits[1], bits[2], bits[3]));
      return;
    }
    __stcs(reinterpret_cast<uint2*>(p), make_uint2(bits[0], bits[1]));
    if (second) __stcs(reinterpret_cast<uint2*>(p + 4), make_uint2(bits[2], bits[3]));
  }
};
__device__ __forceinline__ __half2 round_half2(float a, float b) {
  return __floats2half2_rn(a, b);
}
__device__ __forceinline__ __nv_bfloat162 round_bf162(float a, float b) {
  return __floats2bfloat162_rn(a, b);
}
template <>
struct OutOct<__half> : OutOctHalf<__half, __half2, round_half2> {
  static __device__ __forceinline__ __half one(float v) { return __float2half_rn(v); }
};
template <>
struct OutOct<__nv_bfloat16> : OutOctHalf<__nv_bfloat16, __nv_bfloat162, round_bf162> {
  static __device__ __forceinline__ __nv_bfloat16 one(float v) { return __float2bfloat16_rn(v); }
};

// A group's zero points and scales for a thread's eight columns, as loaded: the scales as
// four words of two 16-bit patterns, and the packed zero word(s) holding the eight fields
// (one word at 2 and 4 bits; two at 8; at 3 bits the 24 bits may continue into the next).
struct GroupWords {
  uint4 scales;
  uint32_t zero_low, zero_high;
};

// A code c (< 2^23) as a float without an int-to-float conversion, which issues at a quarter
// of the FMA rate: the bits of 2^23 + c, less 2^23 + zero. Both are exact, and so is their
// difference c - zero: the value is the same, bit for bit, as scale * float(c - zero).
constexpr uint32_t kMagicBits = 0x4b000000u;  // 2^23 as a float

// Where a thread is in its row: whether its row starts on a 16-byte boundary (`wide`) and
// whether its second four columns exist (`second`), uniform but for the last thread.
struct ColumnSpan {
  int64_t n0, N;
  bool wide, second;
};

// A thread's columns in qzeros and scales: group g's words are at g times the row strides,
// 32-bit products (the launch checks G * N < 2^31) computed once per row in act-order blocks.
struct GroupColumns {
  const uint32_t* zeros;
  const uint16_t* scales;
  const uint16_t* next_scale;  // the wrong-column fault's ninth scale (next_column below)
  int zero_row, scale_row;
};

// Issues the loads of group g's parameters for the thread's columns; decoding is left to
// decode_group so that callers can issue several groups' loads before the first use.
// `wrong_column` (the fault) takes columns n0+1..n0+8 instead, column N wrapping to 0
// (next_column): the eight scales shifted by one, the last from the next thread's first.
template <int kBits>
__device__ __forceinline__ GroupWords load_group(const GroupColumns& columns, int g,
                                                 const ColumnSpan& span, int zero_shift,
                                                 bool wrong_column) {
  const uint32_t* zrow = columns.zeros + g * columns.zero_row;
  const uint16_t* srow = columns.scales + g * columns.scale_row;
  GroupWords w;
  w.zero_low = __ldg(zrow);
  const bool high = kBits == 8 ? span.second : kBits == 3 && zero_shift + kCols * kBits > 32;
  w.zero_high = high ? __ldg(zrow + 1) : 0u;
  if (span.wide) {  // 16-byte aligned: host check
    w.scales = __ldg(reinterpret_cast<const uint4*>(srow));
  } else {
    const uint2 low = __ldg(reinterpret_cast<const uint2*>(srow));
    const uint2 up = span.second ? __ldg(reinterpret_cast<const uint2*>(srow + 4)) : low;
    w.scales = make_uint4(low.x, low.y, up.x, up.y);
  }
  if (wrong_column) {
    const uint32_t next =
        __ldg(reinterpret_cast<const unsigned short*>(columns.next_scale + g * columns.scale_row));
    uint32_t* s = reinterpret_cast<uint32_t*>(&w.scales);
    // Without a second quad the fifth scale is the next column's (the wrapped column 0).
    const uint32_t after_first = span.second ? s[2] : next;
    s[0] = __funnelshift_r(s[0], s[1], 16);
    s[1] = __funnelshift_r(s[1], after_first, 16);
    s[2] = __funnelshift_r(s[2], s[3], 16);
    s[3] = __funnelshift_r(s[3], next, 16);
  }
  return w;
}

// Decoding runs once per row in act-order blocks, where it was most of the kernel's
// instructions (the kernel is issue-bound there, not memory-bound): the one run-time shift is
// applied to the packed zero fields once, every field then sits at a compile-time bit position, and
// a zero becomes a float by its bits (kMagicBits + field + offset, exact below 2^23) instead of an
// int-to-float conversion. fp16 and bf16 scales are both 16-bit patterns, told apart by a flag
// uniform across the grid: one branch instead of a second instantiation of every kernel, which
// halves the file's compile time.
template <int kBits>
__device__ __forceinline__ void decode_group(const GroupWords& w, int zero_shift,
                                             uint32_t zero_bits, bool bf16_scales,
                                             float (&zero)[kCols], float (&scale)[kCols]) {
  // The eight fields from bit 0: at 4 and 8 bits a thread's fields start on a word (n0 is a
  // multiple of 8), at 2 bits at bit 0 or 16, at 3 bits anywhere in the first word.
  uint32_t low = w.zero_low, high = w.zero_high;
  if constexpr (kBits == 2) low >>= zero_shift;
  if constexpr (kBits == 3) low = __funnelshift_r(low, high, zero_shift);
#pragma unroll
  for (int c = 0; c < kCols; ++c) {
    const uint32_t word = kBits == 8 && c >= 4 ? high : low;
    const uint32_t field = (word >> (c * kBits % 32)) & ((1u << kBits) - 1u);
    zero[c] = __uint_as_float(zero_bits + field);
  }
  const uint32_t sw[kCols / 2] = {w.scales.x, w.scales.y, w.scales.z, w.scales.w};
  if (bf16_scales) {
#pragma unroll
    for (int c = 0; c < kCols / 2; ++c) {
      scale[2 * c] = __uint_as_float(sw[c] << 16);
      scale[2 * c + 1] = __uint_as_float(sw[c] & 0xffff0000u);
    }
  } else {
#pragma unroll
    for (int c = 0; c < kCols / 2; ++c) {
      const float2 pair = __half22float2(*reinterpret_cast<const __half2*>(&sw[c]));
      scale[2 * c] = pair.x;
      scale[2 * c + 1] = pair.y;
    }
  }
}

// A group's parameters for the thread's eight columns: as fp32 values, or as four pairs of
// 16-bit patterns for the paired path (GroupPairs).
struct GroupFloats {
  float zero[kCols], scale[kCols];
};
struct GroupPairs {
  uint32_t zero[kCols / 2], scale[kCols / 2];
};

template <int kBits>
__device__ __forceinline__ void decode_group(const GroupWords& w, int zero_shift,
                                             uint32_t zero_bits, bool bf16_scales, GroupFloats& p) {
  decode_group<kBits>(w, zero_shift, zero_bits, bf16_scales, p.zero, p.scale);
}

// Paired arithmetic: when the scales and the output are both fp16, or both bf16 with codes
// of at most 4 bits, a pair of columns is computed with one half2 subtract and one half2
// multiply where the fp32 path takes two conversions, two subtracts, two multiplies and a
// rounding pack. The value is the same bit for bit: a code and a zero point become 16-bit
// floats by their bits (kPairMagic + field, below 1024 for fp16 and 128 for bf16), their
// difference is a small integer and exact, and scale * difference (at most 11 + 9
// significant bits) is exact in fp32, so rounding it once to 16 bits there or in the half2
// multiply gives the same result.
template <typename Out>
constexpr uint32_t kPairMagic = std::is_same_v<Out, __half> ? 0x6400u : 0x4300u;  // 1024, 128
template <int kBits, typename Out>
constexpr bool kPairs = !std::is_same_v<Out, float> && (std::is_same_v<Out, __half> || kBits <= 4);

// Two fields of kBits at bit `shift` of `first` and of `second` (2, 4 or 8 bits: a field
// never leaves its byte) as the low and high 16-bit halves of one word: one byte permute
// gathers both fields' bytes, one shift and one mask finish.
template <int kBits>
__device__ __forceinline__ uint32_t field_pair(uint32_t first, uint32_t second, int shift) {
  static_assert(8 % kBits == 0);
  constexpr uint32_t kMask = (1u << kBits) - 1u;
  const int byte = shift >> 3;
  const uint32_t gathered = __byte_perm(first, second, byte | (byte + 4) << 8);
  return (gathered >> (shift & 7)) & (kMask | kMask << 16);
}

template <int kBits>
__device__ __forceinline__ void decode_group(const GroupWords& w, int zero_shift,
                                             uint32_t zero_pair_bits, bool, GroupPairs& p) {
  uint32_t low = w.zero_low, high = w.zero_high;
  if constexpr (kBits == 2) low >>= zero_shift;
  if constexpr (kBits == 3) low = __funnelshift_r(low, high, zero_shift);
#pragma unroll
  for (int c = 0; c < kCols; c += 2) {
    const uint32_t word = kBits == 8 && c >= 4 ? high : low;
    uint32_t fields;
    if constexpr (kBits == 3) {
      fields = (word >> (c * kBits)) & 7u;
      fields |= ((word >> ((c + 1) * kBits)) & 7u) << 16;
    } else {
      fields = field_pair<kBits>(word, word >> kBits, c * kBits % 32);
    }
    p.zero[c / 2] = zero_pair_bits + fields;
  }
  p.scale[0] = w.scales.x, p.scale[1] = w.scales.y, p.scale[2] = w.scales.z,
  p.scale[3] = w.scales.w;
}

__device__ __forceinline__ uint32_t pair_value(uint32_t scale, uint32_t code, uint32_t zero,
                                               __half) {
  const __half2 d =
      __hsub2(*reinterpret_cast<const __half2*>(&code), *reinterpret_cast<const __half2*>(&zero));
  const __half2 v = __hmul2_rn(*reinterpret_cast<const __half2*>(&scale), d);
  return *reinterpret_cast<const uint32_t*>(&v);
}
__device__ __forceinline__ uint32_t pair_value(uint32_t scale, uint32_t code, uint32_t zero,
                                               __nv_bfloat16) {
  const __nv_bfloat162 d = __hsub2(*reinterpret_cast<const __nv_bfloat162*>(&code),
                                   *reinterpret_cast<const __nv_bfloat162*>(&zero));
  const __nv_bfloat162 v = __hmul2_rn(*reinterpret_cast<const __nv_bfloat162*>(&scale), d);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// One thread owns eight neighbouring columns of a block of rows: the per-row work that does
// not depend on the column (group, bit position) is done once for all eight. Without
// act-order a block's rows lie in one or two groups, whose parameters are loaded once.
// With act-order nearly every row has its own group, and loading a row's group when it
// differed from the previous row's serialised a round trip to L2 per row; such blocks
// load the groups of eight rows at a time before decoding any of them.
// Every row's bit position is a compile-time constant (the loops unroll and the faults
// never move it): the unrolled body stays small enough for the instruction cache, which a
// run-time shift per row had overflowed.
template <int kBits, bool kOutInLayout, typename Out>
__global__ void __launch_bounds__(kThreads)
    dequant_gptq_kernel(const uint32_t* __restrict__ qweight, const uint32_t* __restrict__ qzeros,
                        const uint16_t* __restrict__ scales, bool bf16_scales,
                        const int32_t* __restrict__ g_idx, Out* __restrict__ out, int64_t K,
                        int64_t N, int64_t G, bool v1, int fault) {
  constexpr int kRows = kRowsPerBlock<kBits>;
  constexpr int kWords = kRows * kBits / 32;
  constexpr int kRowsPerBatch = 4;
  const int64_t row0 = static_cast<int64_t>(blockIdx.y) * kRows;
  const int rows = static_cast<int>(K - row0 < kRows ? K - row0 : kRows);
  const int64_t n0 = (static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x) * kCols;
  const bool active = n0 < N;
  const ColumnSpan span{n0, N, N % kCols == 0, n0 + kCols / 2 < N};
  // The block's words first, so that their latency overlaps the groups' below. The word
  // after the block is needed only by the shift fault, which reads every code one bit late.
  const bool shift_fault = fault == dequant_faults::kShiftOffByOne;
  const int64_t total_words = K * kBits / 32;
  uint32_t words[kCols][kWords + 1];
#pragma unroll
  for (int i = 0; i < kWords + 1; ++i) {
    const int64_t w = row0 * kBits / 32 + i;
    const bool load = active && (i < kWords || shift_fault) && w < total_words;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const uint4 quad = load && (h == 0 || span.second)
                             ? *reinterpret_cast<const uint4*>(qweight + w * N + n0 + 4 * h)
                             : make_uint4(0u, 0u, 0u, 0u);
      words[4 * h][i] = quad.x;
      words[4 * h + 1][i] = quad.y;
      words[4 * h + 2][i] = quad.z;
      words[4 * h + 3][i] = quad.w;
    }
  }
  if (shift_fault) {
#pragma unroll
    for (int c = 0; c < kCols; ++c) {
#pragma unroll
      for (int i = 0; i < kWords; ++i)
        words[c][i] = __funnelshift_r(words[c][i], words[c][i + 1], 1);
    }
  }
  // The block's groups and how often they change from one row to the next, from one warp: every
  // thread needs them, and from shared memory the per-row scale and zero loads below no longer wait
  // on a g_idx load each.
  __shared__ int32_t groups[kRows];
  __shared__ int group_changes;
  if (threadIdx.x < kRows) {
    constexpr unsigned kLanes = kRows == 32 ? 0xffffffffu : (1u << kRows) - 1u;
    const int64_t k = row0 + threadIdx.x;
    const int32_t g =
        k < K ? static_cast<int32_t>(dequant_faults::group(k, K, G, g_idx, fault)) : 0;
    groups[threadIdx.x] = g;
    const int32_t previous = __shfl_up_sync(kLanes, g, 1);
    const unsigned changed = __ballot_sync(kLanes, threadIdx.x > 0 && k < K && g != previous);
    if (threadIdx.x == 0) group_changes = __popc(changed);
  }
  __syncthreads();
  if (!active) return;
  const int zero_shift = packed_bits::locate(n0, kBits).shift;
  const bool wrong_column = fault == dequant_faults::kScalesWrongColumn;
  const int64_t next_column = n0 + kCols < N ? n0 + kCols : 0;
  const GroupColumns group_columns{qzeros + n0 * kBits / 32, scales + n0, scales + next_column,
                                   static_cast<int>(N * kBits / 32), static_cast<int>(N)};
  const bool keep_high = dequant_faults::keep_high_word(fault);
  const int columns = span.second ? kCols : kCols / 2;
  // Rows past K (a partial last block) are computed from zero words and not stored: a
  // predicated store, where a loop exit per row had multiplied the unrolled code.
  Out* row_out = kOutInLayout ? out + n0 * K + row0 : out + row0 * N + n0;
  const auto code = [&](int j, int c) {
    const int word = j * kBits >> 5, shift = j * kBits & 31;
    const uint32_t high = keep_high ? words[c][word + 1] : 0u;
    return packed_bits::read_field(words[c][word], high, shift, kBits);
  };
  // The block's rows: `group` holds a group's parameters as decoded for `emit_row`.
  const auto emit_block = [&](auto group, uint32_t zero_bits, const auto& emit_row) {
    if (group_changes == 0) {
      // One group for the whole block (every block without act-order when the group size is
      // a multiple of its rows): its parameters loaded and decoded once.
      decode_group<kBits>(
          load_group<kBits>(group_columns, groups[0], span, zero_shift, wrong_column), zero_shift,
          zero_bits, bf16_scales, group);
#pragma unroll
      for (int j = 0; j < kRows; ++j) emit_row(j, group);
      return;
    }
#pragma unroll
    for (int j0 = 0; j0 < kRows; j0 += kRowsPerBatch) {
      GroupWords batch[kRowsPerBatch];  // rows past K read group 0, which exists
#pragma unroll
      for (int i = 0; i < kRowsPerBatch; ++i)
        batch[i] = load_group<kBits>(group_columns, groups[j0 + i], span, zero_shift, wrong_column);
#pragma unroll
      for (int i = 0; i < kRowsPerBatch; ++i) {
        decode_group<kBits>(batch[i], zero_shift, zero_bits, bf16_scales, group);
        emit_row(j0 + i, group);
      }
    }
  };
  const uint32_t zero_offset = dequant_faults::zero_offset(v1, fault);
  if constexpr (kPairs<kBits, Out> && !kOutInLayout) {
    if (bf16_scales == std::is_same_v<Out, __nv_bfloat16>) {
      const auto emit_pairs = [&](int j, const GroupPairs& group) {
        uint32_t bits[kCols / 2];
#pragma unroll
        for (int c = 0; c < kCols / 2; ++c) {
          uint32_t fields;
          if constexpr (kBits == 3) {
            fields = code(j, 2 * c) | code(j, 2 * c + 1) << 16;
          } else {
            const int word = j * kBits >> 5, shift = j * kBits & 31;
            fields = field_pair<kBits>(words[2 * c][word], words[2 * c + 1][word], shift);
          }
          const uint32_t codes = kPairMagic<Out> * 0x10001u | fields;
          bits[c] = pair_value(group.scale[c], codes, group.zero[c], Out{});
        }
        if (j < rows) {
          OutOct<Out>::store_bits(row_out, bits, span.wide, span.second);
          row_out += N;
        }
      };
      emit_block(GroupPairs{}, (kPairMagic<Out> + zero_offset) * 0x10001u, emit_pairs);
      return;
    }
  }
  const auto emit_floats = [&](int j, const GroupFloats& group) {
    float value[kCols];
#pragma unroll
    for (int c = 0; c < kCols; ++c)
      value[c] = group.scale[c] * (__uint_as_float(kMagicBits | code(j, c)) - group.zero[c]);
    if (j < rows) {
      if constexpr (kOutInLayout) {
#pragma unroll
        for (int c = 0; c < kCols; ++c)
          if (c < columns) row_out[c * K + j] = OutOct<Out>::one(value[c]);
      } else {
        OutOct<Out>::store(row_out, value, span.wide, span.second);
        row_out += N;
      }
    }
  };
  // A zero point z as the bits of 2^23 + z + offset (see kMagicBits); the offset is 0 to 2.
  emit_block(GroupFloats{}, kMagicBits + zero_offset, emit_floats);
}

template <int kBits, typename Out>
cudaError_t launch_typed(const DequantLaunch& a, cudaStream_t stream) {
  constexpr int kRows = kRowsPerBlock<kBits>;
  const int64_t octs = (a.out_features + kCols - 1) / kCols;
  const int64_t row_blocks = (a.in_features + kRows - 1) / kRows;
  if (row_blocks > 65535) return cudaErrorInvalidConfiguration;  // gridDim.y
  if (a.groups * a.out_features >= (int64_t{1} << 31)) return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>((octs + kThreads - 1) / kThreads),
                  static_cast<unsigned>(row_blocks));
  const auto kernel = a.out_in_layout ? dequant_gptq_kernel<kBits, true, Out>
                                      : dequant_gptq_kernel<kBits, false, Out>;
  kernel<<<grid, kThreads, 0, stream>>>(a.qweight, a.qzeros, static_cast<const uint16_t*>(a.scales),
                                        a.scale_type == ElementType::kBFloat16, a.g_idx,
                                        static_cast<Out*>(a.out), a.in_features, a.out_features,
                                        a.groups, a.zero_offset == 1, a.fault);
  return cudaSuccess;
}

template <int kBits>
cudaError_t launch_out(const DequantLaunch& a, cudaStream_t stream) {
  switch (a.out_type) {
    case ElementType::kFloat32:
      return launch_typed<kBits, float>(a, stream);
    case ElementType::kFloat16:
      return launch_typed<kBits, __half>(a, stream);
    case ElementType::kBFloat16:
      return launch_typed<kBits, __nv_bfloat16>(a, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace

cudaError_t launch_dequant_gptq(const DequantLaunch& a, cudaStream_t stream) {
  if (a.in_features == 0 || a.out_features == 0) return cudaSuccess;
  cudaError_t err = cudaErrorInvalidValue;
  switch (a.bits) {
    case 2:
      err = launch_out<2>(a, stream);
      break;
    case 3:
      err = launch_out<3>(a, stream);
      break;
    case 4:
      err = launch_out<4>(a, stream);
      break;
    case 8:
      err = launch_out<8>(a, stream);
      break;
  }
  return err == cudaSuccess ? cudaGetLastError() : err;
}

}  // namespace gradscope::cuda

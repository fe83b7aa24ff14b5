// The dequantization faults (gradscope/faults.h) as the CPU loop and the CUDA kernel
// both apply them; no torch headers. With mode kNone every function is the identity of
// the correct decoder.
#pragma once

#include <cstdint>

#include "packed_bits.h"  // GRADSCOPE_HOST_DEVICE

namespace gradscope::dequant_faults {

// Same numbers as gradscope::Fault (checked in faults.cpp).
enum Mode : int {
  kNone = 0,
  kShiftOffByOne = 1,
  kV1OffsetMissing = 2,
  kV1OffsetTwice = 3,
  kGIdxIgnored = 4,
  kGroupBoundaryOffByOne = 5,
  kStraddleHighBitsDropped = 6,
  kScalesWrongColumn = 7,
};

// Bit position, in a column's packed stream, where a code is read from.
GRADSCOPE_HOST_DEVICE int64_t code_bit(int64_t correct, int mode) {
  return mode == kShiftOffByOne ? correct + 1 : correct;
}
GRADSCOPE_HOST_DEVICE bool keep_high_word(int mode) {
  return mode != kStraddleHighBitsDropped;
}
// v1 adds 1 to the stored field; v2 adds nothing.
GRADSCOPE_HOST_DEVICE int zero_offset(bool v1, int mode) {
  if (!v1) return 0;
  return mode == kV1OffsetMissing ? 0 : mode == kV1OffsetTwice ? 2 : 1;
}
GRADSCOPE_HOST_DEVICE int64_t group(int64_t k, int64_t K, int64_t G, const int32_t* g_idx,
                                    int mode) {
  if (mode == kGIdxIgnored) return k * G / K;
  return g_idx[mode == kGroupBoundaryOffByOne && k + 1 < K ? k + 1 : k];
}
// Column n's scale taken from column n + 1, the last column's from column 0. (The CUDA
// kernel applies the same fault by shifting its loaded scale vector; a test compares.)
GRADSCOPE_HOST_DEVICE int64_t scale_column(int64_t n, int64_t N, int mode) {
  if (mode != kScalesWrongColumn) return n;
  return n + 1 < N ? n + 1 : 0;
}

}  // namespace gradscope::dequant_faults

// Bit-level access to GPTQ packed words, shared by the CPU code and the CUDA
// kernels (no torch headers: .cu files include it).
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define GRADSCOPE_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define GRADSCOPE_HOST_DEVICE inline
#endif

namespace gradscope::packed_bits {

// A packed dimension is a little-endian bitstream: element i occupies bits
// [i * bits, i * bits + bits). Position of element i: word and shift in it.
struct FieldPosition {
  int64_t word;
  int shift;
};

GRADSCOPE_HOST_DEVICE FieldPosition locate(int64_t index, int bits) {
  const int64_t bit = index * bits;
  return {bit >> 5, static_cast<int>(bit & 31)};
}

// True when the field starting at `shift` continues into the next word (3-bit only).
GRADSCOPE_HOST_DEVICE bool straddles(int shift, int bits) {
  return shift + bits > 32;
}

// Extracts a field from the word holding its low bits and the next word. Words
// are treated as uint32 so the shift never sign-extends.
GRADSCOPE_HOST_DEVICE uint32_t read_field(uint32_t low_word, uint32_t high_word, int shift,
                                          int bits) {
  uint32_t value = low_word >> shift;
  if (shift + bits > 32) value |= high_word << (32 - shift);
  return value & ((1u << bits) - 1u);
}

}  // namespace gradscope::packed_bits

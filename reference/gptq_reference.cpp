#include "gptq_reference.h"

#include <stdexcept>
#include <string>

namespace gradscope::reference {
namespace {

// Field `index` of a dimension packed into 32-bit words, where word(i) returns
// the i-th word along that dimension. Written as the spec states each case.
template <typename WordAt>
int64_t packed_field(WordAt word, int64_t index, int bits) {
  const uint64_t maxq = (uint64_t{1} << bits) - 1;
  if (bits == 3) {
    // 32 codes per 3 words: one little-endian 96-bit stream w0 | w1 << 32 | w2 << 64.
    const int64_t block = index / 32, j = index % 32;
    const unsigned __int128 stream = static_cast<unsigned __int128>(word(3 * block)) |
                                     static_cast<unsigned __int128>(word(3 * block + 1)) << 32 |
                                     static_cast<unsigned __int128>(word(3 * block + 2)) << 64;
    return static_cast<int64_t>((stream >> (3 * j)) & maxq);
  }
  // bits 2, 4, 8: p = 32 / bits codes per word, the lowest field holds the first.
  const int64_t p = 32 / bits;
  const uint32_t w = word(index / p);
  return static_cast<int64_t>((w >> (bits * (index % p))) & maxq);
}

void expect_size(size_t actual, int64_t expected, const char* what) {
  if (static_cast<int64_t>(actual) != expected) {
    throw std::invalid_argument(std::string("reference gptq: ") + what + " has " +
                                std::to_string(actual) + " elements, expected " +
                                std::to_string(expected));
  }
}

}  // namespace

void check_layer(const GptqLayer& l) {
  if (l.bits != 2 && l.bits != 3 && l.bits != 4 && l.bits != 8) {
    throw std::invalid_argument("reference gptq: bits must be 2, 3, 4 or 8");
  }
  const int64_t K = l.in_features, N = l.out_features;
  if (l.bits == 3 && (K % 32 != 0 || N % 32 != 0)) {
    throw std::invalid_argument("reference gptq: 3-bit needs K and N multiples of 32");
  }
  if ((K * l.bits) % 32 != 0 || (N * l.bits) % 32 != 0) {
    throw std::invalid_argument("reference gptq: K and N must fill whole words");
  }
  expect_size(l.qweight.size(), K * l.bits / 32 * N, "qweight");
  expect_size(l.qzeros.size(), l.groups * (N * l.bits / 32), "qzeros");
  expect_size(l.scales.size(), l.groups * N, "scales");
  expect_size(l.g_idx.size(), K, "g_idx");
  for (int32_t g : l.g_idx) {
    if (g < 0 || g >= l.groups) throw std::invalid_argument("reference gptq: g_idx out of range");
  }
}

IntMatrix decode_codes(const GptqLayer& l) {
  check_layer(l);
  const int64_t K = l.in_features, N = l.out_features;
  IntMatrix codes(K, N);
  // Elements are independent: threads change the speed, never a value. Rows in
  // memory order: the words of row k's codes are qweight[word(k), :].
#pragma omp parallel for schedule(static)
  for (int64_t k = 0; k < K; ++k) {
    for (int64_t n = 0; n < N; ++n) {
      // qweight is packed along K: the words of column n are qweight[:, n].
      auto word = [&](int64_t i) { return l.qweight[i * N + n]; };
      codes(k, n) = packed_field(word, k, l.bits);
    }
  }
  return codes;
}

IntMatrix decode_zeros(const GptqLayer& l) {
  check_layer(l);
  const int64_t N = l.out_features, row_words = N * l.bits / 32;
  IntMatrix zeros(l.groups, N);
#pragma omp parallel for schedule(static)
  for (int64_t g = 0; g < l.groups; ++g) {
    // qzeros is packed along N: the words of group g are qzeros[g, :].
    auto word = [&](int64_t i) { return l.qzeros[g * row_words + i]; };
    for (int64_t n = 0; n < N; ++n) {
      // Mask first, then add 1 in a wide integer (a field of maxq means maxq + 1).
      zeros(g, n) = packed_field(word, n, l.bits) + (l.v1_zero_minus_one ? 1 : 0);
    }
  }
  return zeros;
}

Matrix dequantize(const GptqLayer& l) {
  const IntMatrix zeros = decode_zeros(l);  // checks the layer
  const int64_t K = l.in_features, N = l.out_features;
  Matrix w(K, N);
  // Each code decoded where its weight is written, as decode_codes decodes it: no matrix of
  // codes the size of the layer beside the weight.
#pragma omp parallel for schedule(static)
  for (int64_t k = 0; k < K; ++k) {
    const int64_t g = l.g_idx[k];
    for (int64_t n = 0; n < N; ++n) {
      auto word = [&](int64_t i) { return l.qweight[i * N + n]; };
      w(k, n) =
          l.scales[g * N + n] * static_cast<double>(packed_field(word, k, l.bits) - zeros(g, n));
    }
  }
  return w;
}

}  // namespace gradscope::reference

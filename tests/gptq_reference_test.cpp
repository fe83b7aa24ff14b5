// The reference on hand-built words: no torch, no kernels/ (this binary links neither).
#include <gtest/gtest.h>

#include <stdexcept>

#include "reference/gptq_reference.h"

namespace gradscope::reference {
namespace {

GptqLayer one_column(int bits, std::vector<uint32_t> qweight, int64_t K) {
  GptqLayer l;
  l.bits = bits;
  l.v1_zero_minus_one = false;
  l.in_features = K;
  l.out_features = 32;  // N * bits / 32 whole words for every width
  l.groups = 1;
  // Column 0 holds the words under test; the other 31 columns are zero.
  l.qweight.assign(qweight.size() * 32, 0u);
  for (size_t i = 0; i < qweight.size(); ++i) l.qweight[i * 32] = qweight[i];
  l.qzeros.assign(bits, 0u);
  l.scales.assign(32, 1.0);
  l.g_idx.assign(K, 0);
  return l;
}

TEST(ReferenceDecode, FourBitFieldsInOrder) {
  const auto codes = decode_codes(one_column(4, {0x76543210u}, 8));
  for (int k = 0; k < 8; ++k) EXPECT_EQ(codes(k, 0), k);
}

TEST(ReferenceDecode, HighBitWordsAreUnsigned) {
  const auto codes = decode_codes(one_column(8, {0xff563412u}, 4));
  EXPECT_EQ(codes(0, 0), 0x12);
  EXPECT_EQ(codes(3, 0), 0xff);
}

TEST(ReferenceDecode, ThreeBitStraddlingCodes) {
  // Code 10 = 0b111: w0 bits 30-31 and w1 bit 0. Code 21 = 0b101: w1 bit 31, w2 bits 0-1 = 0b10.
  const auto codes = decode_codes(one_column(3, {0xC0000000u, 0x80000001u, 0x00000002u}, 32));
  EXPECT_EQ(codes(10, 0), 7);
  EXPECT_EQ(codes(21, 0), 5);
  for (int k = 0; k < 32; ++k) {
    if (k != 10 && k != 21) {
      EXPECT_EQ(codes(k, 0), 0) << "row " << k;
    }
  }
}

TEST(ReferenceDecode, V1AddsOneAfterMasking) {
  GptqLayer l = one_column(4, {0u}, 8);
  l.v1_zero_minus_one = true;
  l.qzeros = {0x0000000Fu, 0x00000000u, 0x00000000u, 0xF0000000u};  // fields 0 and 31 hold 15
  const auto zeros = decode_zeros(l);
  EXPECT_EQ(zeros(0, 0), 16);  // not 0: the +1 is applied after the mask, without wrapping
  EXPECT_EQ(zeros(0, 1), 1);
  EXPECT_EQ(zeros(0, 31), 16);
}

TEST(ReferenceDequant, ScalesGatheredThroughGIdx) {
  GptqLayer l = one_column(4, {0x76543210u}, 8);
  l.groups = 2;
  l.qzeros.assign(2 * 4, 0u);
  l.scales.assign(64, 1.0);
  for (int n = 32; n < 64; ++n) l.scales[n] = 0.25;
  l.g_idx = {0, 1, 0, 1, 0, 1, 0, 1};
  const auto w = dequantize(l);
  EXPECT_EQ(w(2, 0), 2.0);
  EXPECT_EQ(w(3, 0), 0.75);
}

TEST(ReferenceCheck, RejectsInconsistentLayers) {
  GptqLayer l = one_column(4, {0u}, 8);
  l.g_idx[3] = 1;
  EXPECT_THROW(decode_codes(l), std::invalid_argument);
  l = one_column(4, {0u}, 8);
  l.qweight.pop_back();
  EXPECT_THROW(decode_codes(l), std::invalid_argument);
  l = one_column(3, {0u, 0u, 0u}, 32);
  l.in_features = 16;
  EXPECT_THROW(decode_codes(l), std::invalid_argument);
}

}  // namespace
}  // namespace gradscope::reference

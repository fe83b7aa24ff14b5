#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <stdexcept>

#include "gradscope/gptq_format.h"

namespace gradscope {
namespace {

at::Tensor column(std::vector<int32_t> values) {
  return at::tensor(values, at::kInt).view({static_cast<int64_t>(values.size()), 1});
}

uint32_t word(const at::Tensor& packed, int64_t r, int64_t c = 0) {
  return static_cast<uint32_t>(packed[r][c].item<int32_t>());
}

TEST(GptqPack, FourBitLowestFieldHoldsTheFirstRow) {
  const auto packed = pack_rows(column({0, 1, 2, 3, 4, 5, 6, 7}), 4);
  ASSERT_EQ(packed.sizes(), (at::IntArrayRef{1, 1}));
  EXPECT_EQ(word(packed, 0), 0x76543210u);
}

TEST(GptqPack, TwoAndEightBitFields) {
  std::vector<int32_t> two(16, 0);
  two[0] = 3;
  two[15] = 2;
  EXPECT_EQ(word(pack_rows(column(two), 2), 0), 0x80000003u);
  EXPECT_EQ(word(pack_rows(column({0x12, 0x34, 0x56, 0xff}), 8), 0), 0xff563412u);
}

TEST(GptqPack, ThreeBitCodesTenAndTwentyOneStraddleWords) {
  std::vector<int32_t> codes(32, 0);
  codes[10] = 7;  // bits 30..32: two low bits in w0, one in w1
  auto packed = pack_rows(column(codes), 3);
  ASSERT_EQ(packed.size(0), 3);
  EXPECT_EQ(word(packed, 0), 0xC0000000u);
  EXPECT_EQ(word(packed, 1), 0x00000001u);
  EXPECT_EQ(word(packed, 2), 0u);
  codes[10] = 0;
  codes[21] = 7;  // bits 63..65: one bit in w1, two in w2
  packed = pack_rows(column(codes), 3);
  EXPECT_EQ(word(packed, 0), 0u);
  EXPECT_EQ(word(packed, 1), 0x80000000u);
  EXPECT_EQ(word(packed, 2), 0x00000003u);
}

TEST(GptqPack, ThreeBitIsPackedPerColumnNotAsOneFlatStream) {
  // Two columns: the stream runs down each column, never across a row.
  auto codes = at::zeros({32, 2}, at::kInt);
  codes[0][1] = 5;
  const auto packed = pack_rows(codes, 3);
  EXPECT_EQ(word(packed, 0, 0), 0u);
  EXPECT_EQ(word(packed, 0, 1), 5u);
}

TEST(GptqUnpack, TreatsWordsAsUnsigned) {
  // 0xF0000000 is negative as int32; an arithmetic shift would smear ones.
  const auto packed = at::tensor({static_cast<int32_t>(0xF0000000u)}, at::kInt).view({1, 1});
  const auto codes = unpack_rows(packed, 4, 8);
  for (int k = 0; k < 7; ++k) EXPECT_EQ(codes[k][0].item<int32_t>(), 0) << "row " << k;
  EXPECT_EQ(codes[7][0].item<int32_t>(), 15);
}

TEST(GptqUnpack, RoundTripsRandomCodesForEveryWidth) {
  for (int bits : {2, 3, 4, 8}) {
    const auto codes = at::randint(0, 1 << bits, {64, 96}, at::kInt);
    EXPECT_TRUE(unpack_rows(pack_rows(codes, bits), bits, 64).equal(codes)) << bits << " bits";
    EXPECT_TRUE(unpack_columns(pack_columns(codes, bits), bits, 96).equal(codes)) << bits;
  }
}

TEST(GptqPack, RejectsCodesOutOfRangeAndPartialWords) {
  EXPECT_THROW(pack_rows(column({0, 1, 2, 16, 0, 0, 0, 0}), 4), c10::Error);
  EXPECT_THROW(pack_rows(column(std::vector<int32_t>(16, 0)), 3), c10::Error);
  EXPECT_THROW(unpack_rows(at::zeros({3, 4}, at::kInt), 4, 16), c10::Error);
}

TEST(GptqZeros, SymmetricFourBitV1IsAllSevens) {
  const auto zeros = at::full({2, 16}, 8, at::kInt);
  const auto qzeros = encode_zero_points(zeros, 4, ZeroPointFormat::kGptqV1);
  ASSERT_EQ(qzeros.sizes(), (at::IntArrayRef{2, 2}));
  EXPECT_TRUE((qzeros == static_cast<int32_t>(0x77777777)).all().item<bool>());
  EXPECT_TRUE(decode_zero_points(qzeros, 4, 16, ZeroPointFormat::kGptqV1).equal(zeros));
}

TEST(GptqZeros, V1FieldMaxqMeansZeroMaxqPlusOneWithoutWrapping) {
  // Stored fields 15 and 0 (4-bit v1) mean zeros 16 and 1.
  const auto qzeros = at::tensor({static_cast<int32_t>(0x0000000Fu)}, at::kInt).view({1, 1});
  const auto zeros = decode_zero_points(qzeros, 4, 8, ZeroPointFormat::kGptqV1);
  EXPECT_EQ(zeros[0][0].item<int32_t>(), 16);
  EXPECT_EQ(zeros[0][1].item<int32_t>(), 1);
  EXPECT_EQ(decode_zero_points(qzeros, 4, 8, ZeroPointFormat::kGptqV2)[0][0].item<int32_t>(), 15);
}

TEST(GptqZeros, UnrepresentableZerosAreRefusedNotCorrupted) {
  auto zeros = at::full({2, 8}, 3, at::kInt);
  zeros[1][5] = 0;  // v1 would store -1, spilling ones into every higher field
  try {
    encode_zero_points(zeros, 4, ZeroPointFormat::kGptqV1);
    FAIL() << "zero 0 was accepted by v1";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("group 1, column 5"), std::string::npos) << e.what();
  }
  zeros[1][5] = 16;  // v2 cannot hold maxq + 1
  EXPECT_THROW(encode_zero_points(zeros, 4, ZeroPointFormat::kGptqV2), std::invalid_argument);
}

TEST(GptqZeros, ConversionIsFieldByFieldWithoutCarries) {
  // v2 field 15 next to field 0: adding 0x11111111 to the v1 word would carry.
  auto zeros = at::full({1, 8}, 5, at::kInt);
  zeros[0][0] = 15;
  zeros[0][1] = 1;
  const auto v2 = encode_zero_points(zeros, 4, ZeroPointFormat::kGptqV2);
  const auto v1 = convert_zero_points(v2, 4, 8, ZeroPointFormat::kGptqV2, ZeroPointFormat::kGptqV1);
  EXPECT_EQ(word(v1, 0), 0x4444440Eu);
  EXPECT_TRUE(
      convert_zero_points(v1, 4, 8, ZeroPointFormat::kGptqV1, ZeroPointFormat::kGptqV2).equal(v2));
  for (int bits : {2, 3, 4, 8}) {
    const auto z = at::randint(1, 1 << bits, {3, 32}, at::kInt);
    const auto w1 = encode_zero_points(z, bits, ZeroPointFormat::kGptqV1);
    const auto w2 =
        convert_zero_points(w1, bits, 32, ZeroPointFormat::kGptqV1, ZeroPointFormat::kGptqV2);
    EXPECT_TRUE(decode_zero_points(w2, bits, 32, ZeroPointFormat::kGptqV2).equal(z)) << bits;
  }
}

TEST(GptqQuantize, SymmetricZerosAndCodesReconstructWithinHalfAStep) {
  const auto w = at::randn({128, 16}, at::kFloat) * 0.02;
  QuantizeOptions o;
  o.bits = 4;
  o.group_size = 32;
  const auto q = quantize_gptq(w, at::Tensor(), o);
  EXPECT_TRUE((q.zeros == 8).all().item<bool>());
  EXPECT_TRUE(q.g_idx.equal((at::arange(128, at::kInt) / 32).to(at::kInt)));
  const auto scale = q.scales.index_select(0, q.g_idx.to(at::kLong));
  const auto zero = q.zeros.index_select(0, q.g_idx.to(at::kLong));
  const auto recon = scale * (q.codes - zero).to(at::kFloat);
  // Symmetric 4-bit reaches -8 steps but only +7: the top value may clip by up to one step.
  EXPECT_TRUE(((recon - w).abs() <= scale * 1.0001).all().item<bool>());
  EXPECT_LE(((recon - w).abs() <= scale * 0.5001).logical_not().sum().item<int64_t>(), 16);
}

TEST(GptqQuantize, ActOrderGroupsFollowThePermutation) {
  const auto w = at::randn({64, 8}, at::kFloat);
  const auto order = at::randperm(64, at::kLong);
  QuantizeOptions o;
  o.group_size = 16;
  o.desc_act = true;
  const auto q = quantize_gptq(w, order, o);
  for (int64_t i = 0; i < 64; ++i) {
    EXPECT_EQ(q.g_idx[order[i].item<int64_t>()].item<int32_t>(), i / 16);
  }
  o.static_groups = true;
  EXPECT_TRUE(quantize_gptq(w, order, o).g_idx.equal((at::arange(64, at::kInt) / 16).to(at::kInt)));
}

TEST(GptqQuantize, AsymmetricRespectsMinZero) {
  const auto w = at::rand({64, 8}, at::kFloat);  // all positive: the natural zero is 0
  QuantizeOptions o;
  o.sym = false;
  o.group_size = 32;
  EXPECT_TRUE((quantize_gptq(w, at::Tensor(), o).zeros == 0).all().item<bool>());
  o.min_zero = 1;
  EXPECT_TRUE((quantize_gptq(w, at::Tensor(), o).zeros == 1).all().item<bool>());
}

TEST(GptqFloatView, EveryViewDtypeRoundTripsEveryBitPattern) {
  // NaN and subnormal patterns in the view dtype must survive.
  const std::vector<int32_t> patterns = {0x7FC00001, static_cast<int32_t>(0xFFFF7C01),
                                         0x00000001, static_cast<int32_t>(0x80000000),
                                         0x7F800000, -1};
  const auto words = at::tensor(patterns, at::kInt).view({3, 2});
  for (auto dtype : {at::kFloat, at::kHalf, at::kBFloat16}) {
    const auto view = as_float_view(words, dtype);
    EXPECT_EQ(view.scalar_type(), dtype);
    const auto back = as_packed_words(view.clone(), "qweight");
    EXPECT_TRUE(back.equal(words)) << dtype;
  }
}

TEST(GptqFloatView, RejectsViewsThatCannotBeWords) {
  const auto odd = at::zeros({2, 3}, at::kHalf);
  try {
    as_packed_words(odd, "qzeros");
    FAIL();
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what_without_backtrace()).find("qzeros"), std::string::npos);
  }
  EXPECT_THROW(as_packed_words(at::zeros({2, 2}, at::kDouble), "qweight"), c10::Error);
}

GptqWeight small_layer() {
  QuantizeOptions o;
  o.group_size = 32;
  const auto q = quantize_gptq(at::randn({64, 16}), at::Tensor(), o);
  return pack_gptq(q, 4, ZeroPointFormat::kGptqV1, at::kHalf);
}

std::string validation_error(const GptqWeight& w) {
  try {
    validate_gptq_weight(w);
  } catch (const c10::Error& e) {
    return e.what_without_backtrace();
  }
  return "";
}

TEST(GptqValidate, NamesTheTensorAndTheExpectation) {
  EXPECT_EQ(validation_error(small_layer()), "");
  auto w = small_layer();
  w.qweight = w.qweight.narrow(0, 0, 7);
  EXPECT_NE(validation_error(w).find("qweight has 7 rows"), std::string::npos)
      << validation_error(w);
  w = small_layer();
  w.g_idx[3] = 2;
  EXPECT_NE(validation_error(w).find("g_idx values must lie in [0, 2)"), std::string::npos);
  w = small_layer();
  w.scales = w.scales.to(at::kFloat);
  EXPECT_NE(validation_error(w).find("scales must be"), std::string::npos);
  w = small_layer();
  w.qzeros = w.qzeros.narrow(1, 0, 1);
  EXPECT_NE(validation_error(w).find("qzeros has shape"), std::string::npos);
  w = small_layer();
  w.bits = 5;
  EXPECT_NE(validation_error(w).find("bits must be 2, 3, 4 or 8"), std::string::npos);
}

}  // namespace
}  // namespace gradscope

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "harness/compare.h"

namespace gradscope {
namespace {

TEST(CompareExact, PassesOnlyWhenEveryBitMatches) {
  const auto ref = at::linspace(-1, 1, 64, at::kDouble).view({8, 8});
  const auto prod = ref.to(at::kHalf);
  EXPECT_TRUE(compare_exact("case/t", "x", prod, ref).passed);

  auto off = prod.clone();
  // One unit in the last place at (2, 5): the smallest possible mismatch.
  auto off_bits = off.view(at::kShort);
  off_bits[2][5] += 1;
  const auto check = compare_exact("case/t", "x", off, ref);
  EXPECT_FALSE(check.passed);
  EXPECT_EQ(check.mismatches, 1);
  ASSERT_TRUE(check.worst.has_value());
  EXPECT_EQ(check.worst->index, (std::vector<int64_t>{2, 5}));
  EXPECT_NE(check.failure.find("case/t"), std::string::npos);
  EXPECT_NE(check.failure.find("Mismatched elements: 1 / 64"), std::string::npos) << check.failure;
  EXPECT_NE(check.failure.find("at index (2, 5)"), std::string::npos) << check.failure;
}

TEST(CompareExact, SignedZeroIsAMismatch) {
  const auto ref = at::tensor({0.0, 1.0}, at::kDouble);
  const auto prod = at::tensor({-0.0f, 1.0f}, at::kFloat);
  EXPECT_FALSE(compare_exact("p", "x", prod, ref).passed);
}

TEST(CompareExact, AllZeroReferenceIsDegenerate) {
  const auto zeros = at::zeros({4}, at::kDouble);
  const auto check = compare_exact("p", "x", zeros.to(at::kFloat), zeros);
  EXPECT_FALSE(check.passed);
  EXPECT_NE(check.failure.find("degenerate"), std::string::npos);
}

TEST(CompareExact, ShapeMismatchFails) {
  const auto check = compare_exact("p", "x", at::ones({2, 3}), at::ones({3, 2}, at::kDouble));
  EXPECT_FALSE(check.passed);
  EXPECT_NE(check.failure.find("shape mismatch"), std::string::npos);
}

TEST(CompareExact, IntegerTensorsAndDescriber) {
  const auto ref = at::arange(6, at::kLong).view({2, 3});
  auto prod = ref.to(at::kInt);
  prod[1][1] = 9;
  const auto check = compare_exact("p", "x", prod, ref, [](const std::vector<int64_t>& i) {
    return "row " + std::to_string(i[0]);
  });
  EXPECT_FALSE(check.passed);
  EXPECT_EQ(check.max_abs, 5.0);
  EXPECT_NE(check.failure.find("row 1"), std::string::npos);
}

TEST(ExpectRejection, FailsWhenTheOperationProceeded) {
  EXPECT_TRUE(expect_rejection("p", "x", true, "").passed);
  EXPECT_FALSE(expect_rejection("p", "x", false, "").passed);
}

}  // namespace
}  // namespace gradscope

namespace gradscope {
namespace {

TEST(CompareRatio, PassesWithinTwiceTheBaselineErrorPlusFloor) {
  const auto ref = at::linspace(-3, 3, 100, at::kDouble);  // max |ref| = 3: ulp(3) in bf16 = 2^-6
  const auto base = ref + 0.1;
  const auto ok = compare_ratio("c/t", ref + 0.2, base, ref, at::kBFloat16);
  EXPECT_TRUE(ok.passed) << ok.failure;
  EXPECT_NEAR(*ok.baseline_max_abs, 0.1, 1e-12);
  EXPECT_NEAR(ok.limit, 2 * 0.1 + 2 * 0x1.0p-6, 1e-12);
  const auto bad = compare_ratio("c/t", ref + 0.25, base, ref, at::kBFloat16);
  EXPECT_FALSE(bad.passed);
  EXPECT_NE(bad.failure.find("c/t: err(prod) 0.25"), std::string::npos) << bad.failure;
  EXPECT_NE(bad.failure.find("2 x err(base) 0.1"), std::string::npos) << bad.failure;
}

TEST(CompareRatio, FloorCoversAnExactBaselineButOnlyByTwoUlp) {
  const auto ref = at::full({10}, 1.5, at::kDouble);  // ulp(1.5) in fp16 = 2^-10
  EXPECT_TRUE(compare_ratio("p", ref + 0x1.0p-10, ref, ref, at::kHalf).passed);
  EXPECT_FALSE(compare_ratio("p", ref + 0x1.8p-9, ref, ref, at::kHalf).passed);
}

TEST(CompareRatio, ZeroGradientsAreFailures) {
  const auto ref = at::ones({4}, at::kDouble);
  const auto zero = compare_ratio("p/lora_A.grad", at::zeros({4}), at::zeros({4}), ref, at::kFloat);
  EXPECT_FALSE(zero.passed);
  EXPECT_NE(zero.failure.find("prod is all zero"), std::string::npos) << zero.failure;
  EXPECT_FALSE(
      compare_ratio("p", at::zeros({4}), at::zeros({4}), at::zeros({4}, at::kDouble), at::kFloat)
          .passed);
}

TEST(CompareRatio, ReportsWorstElementAndMismatchesUnderDefaultTolerances) {
  const auto ref = at::ones({2, 3}, at::kDouble);
  auto prod = ref.to(at::kFloat).clone();
  prod[1][2] = 1.5;
  const auto c = compare_ratio("p", prod, ref, ref, at::kFloat);
  EXPECT_FALSE(c.passed);
  EXPECT_EQ(c.mismatches, 1);
  EXPECT_EQ(c.worst->index, (std::vector<int64_t>{1, 2}));
  EXPECT_NE(c.failure.find("prod 1.5, base 1, ref 1"), std::string::npos) << c.failure;
  EXPECT_LT(*c.cosine, 1.0);
}

TEST(CompareRatio, NonFiniteProdFailsWithCountAndFirstIndex) {
  const auto ref = at::ones({2, 3}, at::kDouble);
  auto prod = ref.to(at::kFloat).clone();
  prod[1][2] = std::numeric_limits<float>::quiet_NaN();
  prod[0][1] = std::numeric_limits<float>::infinity();
  const auto c = compare_ratio("case/p/lora_A.grad", prod, ref, ref, at::kFloat);
  EXPECT_FALSE(c.passed);
  EXPECT_EQ(c.mismatches, 2);
  EXPECT_TRUE(std::isnan(c.max_abs));
  EXPECT_EQ(c.worst->index, (std::vector<int64_t>{0, 1}));
  EXPECT_NE(c.failure.find("case/p/lora_A.grad: prod has 2 non-finite elements (NaN or Inf) of "
                           "6; first at index (0, 1): prod inf, base 1, ref 1"),
            std::string::npos)
      << c.failure;
}

TEST(CompareRatio, NonFiniteReferenceIsNotAVerdictOnProd) {
  auto ref = at::ones({4}, at::kDouble);
  ref[3] = std::numeric_limits<double>::infinity();
  const auto c = compare_ratio("p", at::ones({4}), at::ones({4}), ref, at::kFloat);
  EXPECT_FALSE(c.passed);
  EXPECT_NE(c.failure.find("p: ref has 1 non-finite element"), std::string::npos) << c.failure;
  EXPECT_NE(c.failure.find("not a verdict on prod"), std::string::npos) << c.failure;
}

}  // namespace
}  // namespace gradscope

#include <ATen/ATen.h>
#include <gtest/gtest.h>

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

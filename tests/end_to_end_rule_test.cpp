// The end-to-end rule (harness/verdict/end_to_end_rule.h): each statistic at and past its
// limit, and the states that are not a pass (no gradient, a wrong dtype, non-finite, zeros)
// or not a verdict (an all-zero reference).
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>

#include "harness/verdict/end_to_end_rule.h"

namespace gradscope {
namespace {

// ref, base = ref + 1 at one element (||base - ref|| = 1: limit 2), prod = ref + `off` there.
GradientRuns runs_with(double off) {
  const auto ref = at::arange(1, 13, at::kDouble).reshape({3, 4});
  auto base = ref.clone(), prod = ref.clone();
  base[1][2] += 1.0;
  prod[2][3] += off;
  return {prod.to(at::kFloat), base.to(at::kFloat), ref, at::kFloat};
}

TEST(EndToEndRule, AGradientPassesAtTwiceTheBaselinesNormAndFailsPastIt) {
  const auto at_limit = judge_gradient("c", "g.grad", runs_with(2.0), false);
  EXPECT_TRUE(at_limit.passed) << at_limit.failure;
  EXPECT_EQ(at_limit.statistic(), "frobenius");
  EXPECT_DOUBLE_EQ(at_limit.gated_error(), 2.0);
  EXPECT_DOUBLE_EQ(at_limit.limit, 2.0);
  const auto past = judge_gradient("c", "g.grad", runs_with(2.5), false);
  EXPECT_FALSE(past.passed);
  EXPECT_EQ(past.path, "c/g.grad");
  EXPECT_NE(past.failure.find("||prod - ref|| 2.5 > limit 2 = 2 x ||base - ref||"),
            std::string::npos)
      << past.failure;
  EXPECT_NE(past.failure.find("largest |prod - ref| 2.5 at (2, 3)"), std::string::npos)
      << past.failure;
}

TEST(EndToEndRule, NoGradientAWrongDtypeNonFiniteOrZerosFail) {
  auto none = runs_with(0.0);
  none.prod.reset();
  EXPECT_NE(judge_gradient("c", "g", none, false).failure.find("no gradient reaches it"),
            std::string::npos);
  auto wrong = runs_with(0.0);
  wrong.prod = wrong.prod->to(at::kHalf);
  const auto w = judge_gradient("c", "g", wrong, false);
  EXPECT_FALSE(w.passed);
  EXPECT_NE(w.failure.find("prod is torch.float16 (3, 4), expected torch.float32 (3, 4)"),
            std::string::npos)
      << w.failure;
  auto inf = runs_with(0.0);
  (*inf.prod)[0][0] = INFINITY;
  const auto i = judge_gradient("c", "g", inf, false);
  EXPECT_FALSE(i.passed);
  EXPECT_TRUE(std::isinf(i.gated_error()));
  auto zeros = runs_with(0.0);
  zeros.prod->zero_();
  EXPECT_NE(judge_gradient("c", "g", zeros, false).failure.find("prod is all zero"),
            std::string::npos);
}

TEST(EndToEndRule, AnAllZeroReferenceIsNotJudged) {
  auto r = runs_with(0.0);
  r.ref.zero_();
  EXPECT_THROW(judge_gradient("c", "g", r, false), EndToEndNotJudged);
}

TEST(EndToEndRule, LossesGateOnTheTokensMeanAndTheLossAddsItsMeansRounding) {
  const auto ref = at::full({64}, 2.0, at::kDouble);
  auto base = ref.clone();
  base[0] += 0.5;  // mean |base - ref| 1/128: limit 1/64 (every figure exact in fp32)
  LossRuns runs;
  runs.ref_tokens = ref;
  runs.base_tokens = base.to(at::kFloat);
  runs.prod_tokens = (ref + 1.0 / 32).to(at::kFloat);
  runs.ref_loss = at::scalar_tensor(2.0, at::kDouble);
  runs.base_loss = at::scalar_tensor(2.0 + 1.0 / 128, at::kFloat);
  runs.prod_loss = at::scalar_tensor(2.0 + 1.0 / 32, at::kFloat);
  const auto checks = judge_losses("c", runs, "step2.", 2, false);
  ASSERT_EQ(checks.size(), 2u);
  EXPECT_EQ(checks[0].path, "c/step2.per_token_loss");
  EXPECT_EQ(checks[0].statistic(), "mean_abs");
  EXPECT_DOUBLE_EQ(checks[0].limit, 1.0 / 64);
  EXPECT_EQ(checks[1].path, "c/step2.loss");
  EXPECT_EQ(checks[1].statistic(), "abs");
  // The loss's floor: 6 u |loss| sqrt(n (n + 1) (2n + 1) / 18) / n, u = 2^-24 for fp32.
  const double n = 64, u = std::ldexp(1.0, -24);
  EXPECT_NEAR(*checks[1].floor, 6 * u * 2.0 * std::sqrt(n * (n + 1) * (2 * n + 1) / 18) / n, 1e-18);
  // Both err by 1/32, past 1/64 (and the loss's floor of 5e-7): they fail, naming the step.
  for (const auto& c : checks) {
    EXPECT_FALSE(c.passed) << c.path;
    EXPECT_EQ(c.failure.rfind("step 2: ", 0), 0u) << c.failure;
  }
  runs.prod_tokens = (ref + 1.0 / 128).to(at::kFloat);
  runs.prod_loss = at::scalar_tensor(2.0, at::kFloat);
  for (const auto& c : judge_losses("c", runs, "", 0, false)) EXPECT_TRUE(c.passed) << c.failure;
}

}  // namespace
}  // namespace gradscope

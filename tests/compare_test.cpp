#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "harness/verdict/compare.h"

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

// The bit view tells what value equality cannot: -0 from +0, and one NaN payload from another.
TEST(BitPattern, TellsSignedZerosAndNaNPayloadsApart) {
  for (auto dtype : {at::kFloat, at::kHalf, at::kBFloat16, at::kDouble}) {
    const auto pos = at::zeros({2}, dtype), neg = -at::zeros({2}, dtype);
    EXPECT_TRUE(pos.equal(neg)) << dtype;  // why the bit view exists
    EXPECT_FALSE(bit_pattern(pos).equal(bit_pattern(neg))) << dtype;
    EXPECT_TRUE(bit_pattern(pos).equal(bit_pattern(pos.clone()))) << dtype;
  }
  const auto nan1 = at::tensor({0x7fc00001}, at::kInt).view(at::kFloat);
  const auto nan2 = at::tensor({0x7fc00002}, at::kInt).view(at::kFloat);
  EXPECT_FALSE(bit_pattern(nan1).equal(bit_pattern(nan2)));
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

// Bits, NaNs included: a tensor against its own copy passes whatever its NaNs' signs, and a
// NaN of the other sign is a mismatch. A ref handed over in a wider dtype is rounded back
// first, which makes every bf16 NaN the canonical one: same-dtype checks (adapters before and
// after a backward) pass theirs as they are.
TEST(CompareExact, NaNsCompareByTheirBits) {
  const auto bf16 = [](std::vector<int16_t> bits) {
    return at::tensor(bits, at::kShort).view(at::kBFloat16);
  };
  const int16_t minus_nan = static_cast<int16_t>(0xFFC0), one = 0x3F80, nan = 0x7FC0;
  const auto t = bf16({minus_nan, one, nan});
  EXPECT_TRUE(compare_exact("p", "x", t, t.clone()).passed);
  EXPECT_EQ(compare_exact("p", "x", t, bf16({nan, one, nan})).mismatches, 1);
  EXPECT_EQ(compare_exact("p", "x", t, t.to(at::kDouble)).mismatches, 1);  // rounded back: +NaN
}

TEST(ExpectRejection, FailsWhenTheOperationProceeded) {
  EXPECT_TRUE(expect_rejection("p", "x", true, "").passed);
  EXPECT_FALSE(expect_rejection("p", "x", false, "").passed);
}

}  // namespace
}  // namespace gradscope

namespace gradscope {
namespace {

// A ratio comparison of fp32 tensors on the CPU with a uniform noise sigma.
RatioInputs ratio_inputs(const std::string& path, const at::Tensor& prod, const at::Tensor& base,
                         const at::Tensor& ref, double sigma) {
  RatioInputs in;
  in.path = path;
  in.prod = prod;
  in.base = base;
  in.ref = ref;
  in.sigma = at::full_like(ref, sigma);
  in.expected = {prod.scalar_type(), at::kCPU};
  in.format = "fp32";
  in.format_max = 3.4028234663852886e38;
  return in;
}

TEST(CompareRatio, PassesWithinTwiceTheBaselineErrorPlusFloor) {
  const auto ref = at::linspace(-3, 3, 100, at::kDouble);
  const auto base = ref + 0.1;
  // floor = 6 sigma = 0.06: limit 2 x 0.1 + 0.06 = 0.26 at every element.
  const auto ok = compare_ratio(ratio_inputs("c/t", ref + 0.25, base, ref, 0.01));
  EXPECT_TRUE(ok.passed) << ok.failure;
  EXPECT_NEAR(*ok.baseline_max_abs, 0.1, 1e-12);
  EXPECT_NEAR(ok.limit, 0.26, 1e-12);
  EXPECT_NEAR(*ok.floor, 0.06, 1e-12);
  const auto bad = compare_ratio(ratio_inputs("c/t", ref + 0.27, base, ref, 0.01));
  EXPECT_FALSE(bad.passed);
  EXPECT_NE(bad.failure.find("c/t: |prod - ref| 0.27"), std::string::npos) << bad.failure;
  EXPECT_NE(bad.failure.find("2 x err(base) 0.1 + floor 0.06"), std::string::npos) << bad.failure;
  EXPECT_NE(bad.failure.find("the base term set the limit"), std::string::npos) << bad.failure;
  EXPECT_NE(bad.failure.find("Elements over their limit: 100 / 100"), std::string::npos)
      << bad.failure;
}

TEST(CompareRatio, TheFloorIsPerElement) {
  // An exact baseline leaves the floor alone: element 0 may be off by 6 x 0.5, element 1 by
  // 6 x 0.001 only.
  const auto ref = at::ones({2}, at::kDouble);
  auto in = ratio_inputs("p", ref + at::tensor({2.9, 0.0}, at::kDouble), ref, ref, 0);
  in.sigma = at::tensor({0.5, 0.001}, at::kDouble);
  EXPECT_TRUE(compare_ratio(in).passed);
  in.prod = ref + at::tensor({0.0, 0.007}, at::kDouble);
  const auto c = compare_ratio(in);
  EXPECT_FALSE(c.passed);
  EXPECT_EQ(c.worst->index, (std::vector<int64_t>{1}));  // the element nearest past its limit
  EXPECT_NEAR(*c.error_to_limit, 0.007 / 0.006, 1e-9);
  EXPECT_NE(c.failure.find("the floor set the limit"), std::string::npos) << c.failure;
}

TEST(CompareRatio, ReportsHowMuchOfTheFloorEachImplementationUses) {
  const auto ref = at::ones({4}, at::kDouble);
  const auto c = compare_ratio(ratio_inputs("p", ref + 0.03, ref + 0.06, ref, 0.01));
  EXPECT_TRUE(c.passed);
  EXPECT_NEAR(*c.floor_use, 0.5, 1e-9);
  EXPECT_NEAR(*c.baseline_floor_use, 1.0, 1e-9);
}

TEST(CompareRatio, ZeroGradientsAreFailures) {
  const auto ref = at::ones({4}, at::kDouble);
  const auto zero =
      compare_ratio(ratio_inputs("p/lora_A.grad", at::zeros({4}), at::zeros({4}), ref, 1e-3));
  EXPECT_FALSE(zero.passed);
  EXPECT_NE(zero.failure.find("prod is all zero"), std::string::npos) << zero.failure;
  EXPECT_FALSE(compare_ratio(ratio_inputs("p", at::zeros({4}), at::zeros({4}),
                                          at::zeros({4}, at::kDouble), 1e-3))
                   .passed);
}

// Zeros where every exact value lies within its own floor of zero are a result a careful
// implementation may return (fp16's SwiGLU h underflowing for activations of 1e-6): the check
// cannot be judged, whatever the baseline's rounding gave. One element past its floor, a NaN or
// infinite floor, or a layer the floor's model does not cover, and zeros fail.
TEST(CompareRatio, ZerosWithinTheFloorOfZeroCannotBeJudged) {
  const auto zeros = at::zeros({4}, at::kDouble);
  const auto ref = at::tensor({1e-10, -3e-10, 0.0, 2e-10}, at::kDouble);
  auto in = ratio_inputs("p/down_proj/lora_A.grad", zeros, zeros, ref, 1e-10);  // floor 6e-10
  auto c = compare_ratio(in);
  EXPECT_FALSE(c.passed);
  EXPECT_TRUE(c.out_of_range);
  EXPECT_NE(c.failure.find("p/down_proj/lora_A.grad: cannot be judged: prod is all zero"),
            std::string::npos)
      << c.failure;
  // The element nearest its own floor is named, with the ratio.
  EXPECT_NE(c.failure.find("at index (1): ref -3e-10"), std::string::npos) << c.failure;
  EXPECT_NE(c.failure.find("|ref| / floor 0.5"), std::string::npos) << c.failure;
  auto nearest = in;  // nearest its own floor, not the largest |ref|: element 3 (1/3), not 1
  nearest.sigma = at::tensor({1e-10, 1e-9, 1e-10, 1e-10}, at::kDouble);
  const auto n = compare_ratio(nearest);
  EXPECT_TRUE(n.out_of_range);
  EXPECT_NE(n.failure.find("at index (3): ref 2e-10"), std::string::npos) << n.failure;

  const auto fails_as_degenerate = [](const RatioInputs& i) {
    const auto d = compare_ratio(i);
    EXPECT_FALSE(d.passed);
    EXPECT_FALSE(d.out_of_range);
    EXPECT_NE(d.failure.find("degenerate: prod is all zero"), std::string::npos) << d.failure;
  };
  auto past = in;  // one element past its floor of 6e-10
  past.ref = at::tensor({1e-10, -7e-10, 0.0, 2e-10}, at::kDouble);
  fails_as_degenerate(past);
  auto per_element = in;  // per element: a large value within its large floor passes, a small
  per_element.ref = at::tensor({1e-3, 2e-10, 0.0, 0.0}, at::kDouble);  // one past its small one
  per_element.sigma = at::tensor({1e-3, 1e-11, 1e-11, 1e-11}, at::kDouble);
  fails_as_degenerate(per_element);
  per_element.ref = at::tensor({1e-3, 6e-11, 0.0, 0.0}, at::kDouble);  // exactly at its floor
  EXPECT_TRUE(compare_ratio(per_element).out_of_range);
  for (const double bad : {std::nan(""), std::numeric_limits<double>::infinity()}) {
    auto unbounded = in;
    unbounded.sigma = at::tensor({1e-10, bad, 1e-10, 1e-10}, at::kDouble);
    fails_as_degenerate(unbounded);
  }
  auto base_rounds_up = in;  // a baseline whose rounding lands on a nonzero value: no test
  base_rounds_up.base = at::tensor({0.0, -6e-10, 0.0, 0.0}, at::kDouble);
  EXPECT_TRUE(compare_ratio(base_rounds_up).out_of_range);
  auto not_covered = in;
  not_covered.not_judged = "layer 1's attention is past the floor's model";
  fails_as_degenerate(not_covered);

  in.prod = ref * 0.5;  // a nonzero prod within its floors passes, as before
  EXPECT_TRUE(compare_ratio(in).passed);
}

TEST(CompareRatio, ReportsWorstElementAndMismatchesUnderDefaultTolerances) {
  const auto ref = at::ones({2, 3}, at::kDouble);
  auto prod = ref.to(at::kFloat).clone();
  prod[1][2] = 1.5;
  const auto c = compare_ratio(ratio_inputs("p", prod, ref, ref, 1e-7));
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
  const auto c = compare_ratio(ratio_inputs("case/p/lora_A.grad", prod, ref, ref, 1e-7));
  EXPECT_FALSE(c.passed);
  EXPECT_FALSE(c.out_of_range);
  EXPECT_EQ(c.mismatches, 2);
  EXPECT_TRUE(std::isinf(c.max_abs));
  EXPECT_EQ(c.worst->index, (std::vector<int64_t>{0, 1}));
  EXPECT_NE(c.failure.find("case/p/lora_A.grad: prod has 2 non-finite elements (NaN or Inf) of "
                           "6; first at index (0, 1): prod inf, base 1, ref 1"),
            std::string::npos)
      << c.failure;
  EXPECT_NE(c.failure.find("the exact result is finite and within fp32 range"), std::string::npos)
      << c.failure;
}

TEST(CompareRatio, AnOverflowTheCarefulModelSharesIsOutOfRange) {
  const auto ref = at::ones({3}, at::kDouble);
  auto in = ratio_inputs("p", at::full({3}, INFINITY), at::full({3}, INFINITY), ref, 1e-3);
  in.format = "fp16";
  in.model_overflow = "its mlp/h reaches 7.1e+04 > fp16 max 65504";
  const auto c = compare_ratio(in);
  EXPECT_FALSE(c.passed);
  EXPECT_TRUE(c.out_of_range);
  EXPECT_NE(c.failure.find("a careful implementation overflows too (its mlp/h reaches"),
            std::string::npos)
      << c.failure;
}

// Where the exact value lies within the floor of the overflow boundary (65520 in fp16), a
// careful implementation may round past it: prod's infinity of that sign there is left out,
// and the other elements decide. Within their limits, the case's range (not a verdict);
// over, a failure.
TEST(CompareRatio, AnOverflowWithinTheFloorOfTheBoundaryIsLeftOut) {
  const auto ref = at::tensor({1.0, 65487.9, 65376.0}, at::kDouble);
  const auto half = [](std::vector<double> v) { return at::tensor(v, at::kDouble).to(at::kHalf); };
  auto in = ratio_inputs("p/lora_A.grad", half({1, INFINITY, 65376}), half({1, INFINITY, 65376}),
                         ref, 1e-3);
  in.format = "fp16";
  in.format_max = 65504;
  in.sigma = at::tensor({1e-3, 6.0, 1e-3}, at::kDouble);  // floor 36: 65523.9 reaches 65520
  const auto near = compare_ratio(in);
  EXPECT_FALSE(near.passed);
  EXPECT_TRUE(near.out_of_range);
  EXPECT_EQ(near.worst->index, (std::vector<int64_t>{1}));
  EXPECT_NE(near.failure.find("p/lora_A.grad: prod has 1 infinite element of 3, each where the "
                              "exact value lies within a careful implementation's rounding of "
                              "fp16's overflow boundary 65520: first at index (1): prod inf, "
                              "base inf, ref 65487.9, floor 36"),
            std::string::npos)
      << near.failure;
  // Another element over its limit: a verdict, with the element left out noted.
  in.prod = half({2, INFINITY, 65376});
  const auto over = compare_ratio(in);
  EXPECT_FALSE(over.passed);
  EXPECT_FALSE(over.out_of_range);
  EXPECT_EQ(over.worst->index, (std::vector<int64_t>{0}));
  EXPECT_NE(over.note.find("1 element where prod overflowed within the floor of fp16's overflow "
                           "boundary left out"),
            std::string::npos)
      << over.note;
  // Floor 30: 65517.9, short of the boundary; an infinity of the other sign; a NaN; one
  // element lost far from the boundary: each a verdict.
  const auto fails = [&](const at::Tensor& prod, const at::Tensor& sigma) {
    auto c = in;
    c.prod = prod;
    c.sigma = sigma;
    const auto check = compare_ratio(c);
    return !check.passed && !check.out_of_range &&
           check.failure.find("the exact result is finite and within fp16 range") !=
               std::string::npos;
  };
  const auto near_sigma = at::tensor({1e-3, 6.0, 1e-3}, at::kDouble);
  EXPECT_TRUE(fails(half({1, INFINITY, 65376}), at::tensor({1e-3, 5.0, 1e-3}, at::kDouble)));
  EXPECT_TRUE(fails(half({1, -INFINITY, 65376}), near_sigma));
  EXPECT_TRUE(fails(half({1, NAN, 65376}), near_sigma));
  EXPECT_TRUE(fails(half({INFINITY, INFINITY, 65376}), near_sigma));
}

TEST(CompareRatio, AReferenceBeyondTheFormatIsOutOfRange) {
  const auto ref = at::tensor({1.0, -70000.0}, at::kDouble);
  auto in = ratio_inputs("p/output", at::full({2}, INFINITY, at::kHalf), ref, ref, 1e-3);
  in.format = "fp16";
  in.format_max = 65504;
  const auto c = compare_ratio(in);
  EXPECT_FALSE(c.passed);
  EXPECT_TRUE(c.out_of_range);
  EXPECT_NE(c.failure.find("p/output: out of range for fp16: the exact value reaches |ref| = "
                           "70000 at index (1), beyond fp16's largest finite value 65504"),
            std::string::npos)
      << c.failure;
  // Below the overflow boundary 65520 (max + half an ulp) an exact value rounds to 65504: in
  // range, and judged; at it, it rounds to infinity.
  in.prod = at::tensor({1.0, -65504.0}, at::kDouble).to(at::kHalf);
  in.base = in.prod;
  in.sigma = at::full({2}, 10.0, at::kDouble);
  in.ref = at::tensor({1.0, -65519.9}, at::kDouble);
  const auto inside = compare_ratio(in);
  EXPECT_FALSE(inside.out_of_range);
  EXPECT_TRUE(inside.passed) << inside.failure;
  in.ref = at::tensor({1.0, -65520.0}, at::kDouble);
  EXPECT_TRUE(compare_ratio(in).out_of_range);
}

TEST(CompareRatio, AnOverflowingBaselineLeavesProdToTheFloorAlone) {
  const auto ref = at::ones({4}, at::kDouble);
  auto base = at::ones({4}, at::kDouble);
  base[2] = INFINITY;
  const auto ok = compare_ratio(ratio_inputs("p", ref + 0.05, base, ref, 0.01));
  EXPECT_TRUE(ok.passed) << ok.failure;
  EXPECT_FALSE(ok.baseline_max_abs.has_value());
  EXPECT_NE(ok.note.find("base has 1 non-finite elements"), std::string::npos) << ok.note;
  const auto bad = compare_ratio(ratio_inputs("p", ref + 0.07, base, ref, 0.01));
  EXPECT_FALSE(bad.passed);
  EXPECT_NE(bad.failure.find("prod is judged against the floor alone"), std::string::npos)
      << bad.failure;
}

// Where the floor's model does not hold (an attention past its first order), a check within
// its limits and one past them are both out of range, their figures reported; what the floor
// does not decide (a wrong dtype, an all-zero prod) still fails.
TEST(CompareRatio, ACheckTheFloorsModelDoesNotCoverIsNotJudged) {
  const auto ref = at::ones({4}, at::kDouble);
  const std::string why = "layer 1's attention is past the floor's model";
  auto in = ratio_inputs("p/output", ref + 0.01, ref, ref, 0.01);
  in.not_judged = why;
  auto c = compare_ratio(in);
  EXPECT_FALSE(c.passed);
  EXPECT_TRUE(c.out_of_range);
  EXPECT_NEAR(c.max_abs, 0.01, 1e-12);
  EXPECT_NEAR(*c.error_to_limit, 0.01 / 0.06, 1e-9);  // the figures as if judged
  EXPECT_NE(c.failure.find("p/output: cannot be judged: " + why + "; max |prod - ref| 0.01"),
            std::string::npos)
      << c.failure;
  in.prod = ref + 5.0;  // far past its limit: still no verdict
  c = compare_ratio(in);
  EXPECT_TRUE(c.out_of_range);
  EXPECT_NE(c.failure.find("cannot be judged"), std::string::npos) << c.failure;
  in.prod = at::zeros({4}, at::kDouble);
  c = compare_ratio(in);
  EXPECT_FALSE(c.out_of_range);
  EXPECT_NE(c.failure.find("prod is all zero"), std::string::npos) << c.failure;
  in.prod = ref + 0.01;
  in.expected = {at::kBFloat16, at::kCPU};
  c = compare_ratio(in);
  EXPECT_FALSE(c.out_of_range);
  EXPECT_NE(c.failure.find("attribute 'dtype' do not match"), std::string::npos) << c.failure;
}

TEST(CompareRatio, AWrongDtypeOrDeviceFailsBeforeAnyValue) {
  const auto ref = at::ones({4}, at::kDouble);
  auto in = ratio_inputs("p/output", at::ones({4}, at::kFloat), ref, ref, 1.0);
  in.expected = {at::kBFloat16, at::kCPU};
  auto c = compare_ratio(in);
  EXPECT_FALSE(c.passed);
  EXPECT_NE(c.failure.find("p/output: the values for attribute 'dtype' do not match: prod is "
                           "fp32, expected bf16"),
            std::string::npos)
      << c.failure;
  in.expected = {at::kFloat, at::Device(at::kCUDA, 0)};
  c = compare_ratio(in);
  EXPECT_FALSE(c.passed);
  EXPECT_NE(c.failure.find("attribute 'device' do not match: prod is on cpu, expected cuda:0"),
            std::string::npos)
      << c.failure;
  in.expected = {at::kFloat, at::kCPU};
  in.prod = at::ones({2, 2});
  c = compare_ratio(in);
  EXPECT_FALSE(c.passed);
  EXPECT_NE(c.failure.find("attribute 'shape' do not match"), std::string::npos) << c.failure;
}

TEST(CompareExact, AWrongDtypeFailsEvenWhenCloserToTheReference) {
  // A dequant that returns fp32 for a bf16 case is closer to the reference and still wrong.
  const auto ref = at::tensor({1.0 / 3, 2.0 / 3}, at::kDouble);
  const auto c = compare_exact("w", "x", ref.to(at::kFloat), ref, {}, false,
                               Expected{at::kBFloat16, at::kCPU});
  EXPECT_FALSE(c.passed);
  EXPECT_NE(c.failure.find("'dtype' do not match: prod is fp32, expected bf16"), std::string::npos)
      << c.failure;
  EXPECT_TRUE(compare_exact("w", "x", ref.to(at::kBFloat16), ref, {}, false,
                            Expected{at::kBFloat16, at::kCPU})
                  .passed);
}

// Over several of the verdict's chunks (and a partial one): each figure is what the element-wise
// expression gives (maxima, counts and the worst element exactly, sums to rounding), the first
// of two equal worst elements wins, and no figure depends on the thread count.
TEST(CompareRatio, FiguresOverManyChunksAreTheElementwiseOnesWhateverTheThreadCount) {
  const int64_t n = 3 * 32768 + 1001;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(5);
  const auto ref = at::randn({n}, gen, at::kDouble);
  const auto sigma = at::rand({n}, gen, at::kDouble) * 1e-6 + 1e-7;
  auto prod = (ref + at::randn({n}, gen, at::kDouble) * 1e-7).to(at::kFloat);
  const auto base = (ref + at::randn({n}, gen, at::kDouble) * 1e-7).to(at::kFloat);
  // Two equal worst elements, in the second and the fourth chunk.
  for (const int64_t i : {int64_t{40000}, int64_t{99000}}) {
    ref[i] = 1.0;
    sigma[i] = 1e-7;
    prod[i] = 1.0f + 0x1.0p-20f;
  }
  const auto judge = [&] {
    auto in = ratio_inputs("t", prod, base, ref, 0.0);
    in.sigma = sigma;
    return compare_ratio(in);
  };
  const int threads = at::get_num_threads();
  at::set_num_threads(1);
  const auto one = judge();
  at::set_num_threads(std::max(threads, 2));
  const auto many = judge();
  at::set_num_threads(threads);

  const auto p = prod.to(at::kDouble), b = base.to(at::kDouble);
  const auto diff = (p - ref).abs(), base_diff = (b - ref).abs();
  const auto floor = sigma * kFloorSigmas;
  const double base_term = 2.0 * base_diff.max().item<double>();
  const auto score = diff / (floor + base_term);
  const int64_t worst = score.argmax().item<int64_t>();
  ASSERT_EQ(worst, 40000);
  const auto bins =
      ((diff.clamp_min(1e-300).log10() - report::kErrorBinLow) / report::kErrorBinStep)
          .floor()
          .clamp(0, report::kErrorBins - 1)
          .to(at::kLong);
  const auto histogram = at::bincount(bins, {}, report::kErrorBins);
  for (const auto* c : {&one, &many}) {
    EXPECT_EQ(c->max_abs, diff.max().item<double>());
    EXPECT_EQ(c->baseline_max_abs, base_diff.max().item<double>());
    EXPECT_EQ(c->floor_use, (diff / floor).max().item<double>());
    EXPECT_EQ(c->baseline_floor_use, (base_diff / floor).max().item<double>());
    EXPECT_EQ(c->error_to_limit, score[worst].item<double>());
    EXPECT_EQ(c->limit, floor[worst].item<double>() + base_term);
    ASSERT_TRUE(c->worst.has_value());
    EXPECT_EQ(c->worst->index, std::vector<int64_t>{worst});
    EXPECT_EQ(c->mismatches, diff.gt(ref.abs() * 1.3e-6 + 1e-5).sum().item<int64_t>());
    EXPECT_EQ(c->error_histogram,
              std::vector<int64_t>(histogram.data_ptr<int64_t>(),
                                   histogram.data_ptr<int64_t>() + histogram.numel()));
    EXPECT_NEAR(c->mean_abs, diff.mean().item<double>(), 1e-12 * c->mean_abs);
    EXPECT_NEAR(*c->rel_fro, ((p - ref).norm() / ref.norm()).item<double>(), 1e-12);
  }
  EXPECT_EQ(one.mean_abs, many.mean_abs);
  EXPECT_EQ(one.baseline_mean_abs, many.baseline_mean_abs);
  EXPECT_EQ(one.rel_fro, many.rel_fro);
  EXPECT_EQ(one.cosine, many.cosine);

  // The first non-finite element is found in a later chunk than the first.
  prod[70000] = std::numeric_limits<float>::infinity();
  prod[50000] = std::numeric_limits<float>::quiet_NaN();
  const auto bad = judge();
  EXPECT_EQ(bad.mismatches, 2);
  ASSERT_TRUE(bad.worst.has_value());
  EXPECT_EQ(bad.worst->index, std::vector<int64_t>{50000});
}

// A NaN in the floor fails the check wherever it falls, as ATen's NaN-propagating maxima made
// it: at the start of the first and the second chunk and inside the third, each time with an
// element over its limit after it in the same chunk.
TEST(CompareRatio, ANaNFloorFailsTheCheckInAnyChunk) {
  const int64_t n = 3 * 32768;
  const auto ref = at::linspace(1.0, 2.0, n, at::kDouble);
  auto sigma = at::full({n}, 1e-6, at::kDouble);
  auto prod = ref.to(at::kFloat);
  for (const int64_t at_index : {int64_t{0}, int64_t{32768}, int64_t{70000}}) {
    auto s = sigma.clone();
    s[at_index] = std::numeric_limits<double>::quiet_NaN();
    auto p = prod.clone();
    p[at_index + 100] = p[at_index + 100].item<float>() + 1.0f;
    auto in = ratio_inputs("t", p, ref.to(at::kFloat), ref, 0.0);
    in.sigma = s;
    const auto c = compare_ratio(in);
    EXPECT_FALSE(c.passed) << "NaN at " << at_index;
    EXPECT_TRUE(std::isnan(c.error_to_limit.value_or(0))) << "NaN at " << at_index;
    EXPECT_TRUE(std::isnan(c.floor_use.value_or(0))) << "NaN at " << at_index;
    ASSERT_TRUE(c.worst.has_value());
    EXPECT_EQ(c.worst->index, std::vector<int64_t>{at_index});
  }
}

}  // namespace
}  // namespace gradscope

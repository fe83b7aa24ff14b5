#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <set>
#include <vector>

#include "harness/generate/gptq_layer_gen.h"
#include "harness/generate/normal_draw.h"
#include "harness/generate/philox.h"
#include "harness/generate/seeded_streams.h"

namespace gradscope {
namespace {

// Known-answer vectors of Random123 (tests/kat_vectors, the "philox4x32 10" lines).
TEST(Philox, MatchesRandom123KnownAnswers) {
  struct Kat {
    philox::Counter counter;
    philox::Key key;
    philox::Counter expected;
  };
  const Kat kats[] = {
      {{0, 0, 0, 0}, {0, 0}, {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
      {{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff},
       {0xffffffff, 0xffffffff},
       {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
      {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344},
       {0xa4093822, 0x299f31d0},
       {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}},
  };
  for (const auto& kat : kats) {
    EXPECT_EQ(philox::philox4x32_10(kat.counter, kat.key), kat.expected);
  }
}

TEST(SeededStream, ElementsDependOnlyOnSeedNameAndIndex) {
  const SeededStream a(7, "lora_A"), b(7, "lora_A");
  // Drawn in opposite orders, the values agree: there is no hidden state.
  std::vector<double> forward, backward(100);
  for (int i = 0; i < 100; ++i) forward.push_back(a.normal(i));
  for (int i = 99; i >= 0; --i) backward[i] = b.normal(i);
  EXPECT_EQ(forward, backward);
}

TEST(SeededStream, NamesAndSeedsGiveDistinctStreams) {
  EXPECT_NE(SeededStream(7, "lora_A").key(), SeededStream(7, "lora_B").key());
  EXPECT_NE(SeededStream(7, "lora_A").key(), SeededStream(8, "lora_A").key());
  EXPECT_NE(SeededStream(7, "x").normal(0), SeededStream(7, "y").normal(0));
}

// Recorded values of the project's stream derivation and sampler (v0.1.0). Every
// seed in a report replays only while these hold: a change here changes every
// case's inputs, so it must be deliberate.
TEST(SeededStream, RecordedValuesOfTheProjectSampler) {
  const SeededStream s(2080, "weight");
  EXPECT_EQ(s.key(), (philox::Key{0x8c6fe987u, 0xef05cf78u}));
  // Box-Muller goes through libm's log and cos: allow a few ulps across libms.
  EXPECT_DOUBLE_EQ(s.normal(0), -1.0173719295752175);
  EXPECT_EQ(s.uniform(1), 0.69969647741248564);
}

TEST(SeededStream, UniformAndNormalHaveTheRightMoments) {
  const SeededStream s(1, "moments");
  const int n = 200000;
  double su = 0, sn = 0, sn2 = 0, umin = 1, umax = 0;
  for (int i = 0; i < n; ++i) {
    const double u = s.uniform(i), z = s.normal(i);
    su += u;
    sn += z;
    sn2 += z * z;
    umin = std::min(umin, u);
    umax = std::max(umax, u);
  }
  // Bounds are 5 standard errors of each estimate (a false alarm ~ 1e-6).
  EXPECT_NEAR(su / n, 0.5, 5 * std::sqrt(1.0 / 12 / n));
  EXPECT_NEAR(sn / n, 0.0, 5 * std::sqrt(1.0 / n));
  EXPECT_NEAR(sn2 / n, 1.0, 5 * std::sqrt(2.0 / n));
  EXPECT_GT(umin, 0.0);
  EXPECT_LT(umax, 1.0);
}

TEST(SeededStream, PermutationIsAPermutationAndSeeded) {
  const auto p = permutation(3, "act_order", 1000);
  const auto sorted = std::get<0>(p.sort());
  EXPECT_TRUE(sorted.equal(at::arange(1000, at::kLong)));
  EXPECT_TRUE(p.equal(permutation(3, "act_order", 1000)));
  EXPECT_FALSE(p.equal(permutation(4, "act_order", 1000)));
  EXPECT_FALSE(p.equal(at::arange(1000, at::kLong)));
}

TEST(SeededStream, TensorsAreFp64AndMatchTheStream) {
  const auto t = normal_tensor(5, "x", {3, 4}, 0.5);
  EXPECT_EQ(t.scalar_type(), at::kDouble);
  EXPECT_EQ(t[1][2].item<double>(), 0.5 * SeededStream(5, "x").normal(6));
}

// The fp32 draw is the fp64 draw converted, bit for bit (a generated weight's values must not
// depend on which of the two made it), over enough elements to cross the parallel chunks.
TEST(SeededStream, Fp32TensorsAreTheFp64DrawsConverted) {
  const auto f = normal_tensor_fp32(7, "w", {129, 257}, 0.02);
  EXPECT_EQ(f.scalar_type(), at::kFloat);
  const auto d = normal_tensor(7, "w", {129, 257}, 0.02).to(at::kFloat);
  EXPECT_TRUE(f.view(at::kInt).equal(d.view(at::kInt)));
}

// The vectorised fp32 draw against the defining one, value by value, over about 2^20 elements
// (a count that is no multiple of the lanes, across a step of the counter's high word) of two
// streams and two scales: every value it decides is the defining draw rounded to fp32, the few
// it leaves undecided exist (so the fallback runs), are rare and are NaN until drawn.
TEST(NormalDraw, BlockDecidesTheDefiningValueOrLeavesItUndecided) {
  constexpr int64_t kCount = (int64_t{1} << 20) - 3;
  std::vector<float> out(kCount + 1, 7.0f);
  std::vector<int64_t> undecided(kCount);
  for (const double stddev : {0.02, 1.0}) {
    for (const char* name : {"w", "layers.3.down_proj.weight"}) {
      const SeededStream stream(9, name);
      const uint64_t first = (uint64_t{5} << 32) - 1000;
      const int64_t left = normal_draw::fp32_block(stream.key(), first, kCount, stddev, out.data(),
                                                   undecided.data());
      EXPECT_GT(left, 0) << name;
      EXPECT_LT(left, kCount / 4096) << name;
      EXPECT_EQ(out[kCount], 7.0f) << "written past the block";
      std::vector<char> open(kCount, 0);
      for (int64_t j = 0; j < left; ++j) {
        open[undecided[j]] = 1;
        EXPECT_TRUE(std::isnan(out[undecided[j]])) << name << " undecided offset " << undecided[j];
      }
      int64_t mismatches = 0;
      for (int64_t i = 0; i < kCount; ++i) {
        if (open[i]) continue;
        const float want = static_cast<float>(stddev * stream.normal(first + i));
        if (std::memcmp(&want, &out[i], sizeof want) != 0 && mismatches++ < 3) {
          ADD_FAILURE() << name << " element " << first + i << ": " << out[i] << " vs " << want;
        }
      }
      EXPECT_EQ(mismatches, 0) << name << ", stddev " << stddev;
    }
  }
}

// The edges of the evaluation: cos near its zeros and extremes (the quadrant boundaries of
// the reduction), log near 0 and at the smallest uniform, the mantissa's sqrt(2) split.
TEST(NormalDraw, CandidateIsTheDefiningValueAtTheEdges) {
  const auto defining = [](double u1, double u2, double stddev) {
    return static_cast<float>(stddev *
                              (std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2)));
  };
  const auto walk = [](double x, int steps) {
    std::vector<double> v;
    double lo = x, hi = x;
    for (int i = 0; i < steps; ++i) {
      lo = std::nextafter(lo, 0.0), hi = std::nextafter(hi, 2.0);
      if (lo > 0) v.push_back(lo);
      if (hi <= 1) v.push_back(hi);
    }
    v.push_back(x);
    return v;
  };
  std::vector<double> u1s, u2s;
  for (const double e : {0x1.0p-54, 0.5, std::sqrt(0.5), 0.25 * std::sqrt(2.0), 1.0, 0.9}) {
    for (double u : walk(e, 40)) u1s.push_back(u);
  }
  for (const double e : {0.125, 0.25, 0.375, 0.5, 0.625, 0.75, 0.875, 1.0}) {
    for (double u : walk(e, 200)) u2s.push_back(u);
  }
  int64_t decided = 0, mismatches = 0;
  for (const double stddev : {0.02, 1.0, 3e-41}) {
    for (const double u1 : u1s) {
      for (const double u2 : u2s) {
        const auto c = normal_draw::fp32_candidate(u1, u2, stddev);
        if (!c.certain) continue;
        ++decided;
        const float want = defining(u1, u2, stddev);
        if (std::memcmp(&want, &c.value, sizeof want) != 0 && mismatches++ < 3) {
          ADD_FAILURE() << "u1 " << u1 << ", u2 " << u2 << ", stddev " << stddev << ": " << c.value
                        << " vs " << want;
        }
      }
    }
  }
  EXPECT_EQ(mismatches, 0);
  EXPECT_GT(decided, int64_t(u1s.size() * u2s.size()));  // most of the three scales' pairs
  EXPECT_FALSE(normal_draw::fp32_candidate(1.0, 0.3, 1.0).certain);  // a zero: left undecided
}

// A seeded layer drawn again (the process keeps its latest layers) is the layer a fresh draw
// gives, for each quantizer setting the key must tell apart, and a caller that writes into
// what it got does not change the next draw.
TEST(SeededLayer, DrawnAgainIsTheFreshDrawForEverySetting) {
  const auto fresh = [](const QuantizeOptions& o) {
    const auto order = o.desc_act ? permutation(11, "p.act_order", 64) : at::Tensor();
    return quantize_gptq(normal_tensor_fp32(11, "p.weight", {64, 48}, 0.02), order, o);
  };
  const auto same = [](const QuantizedWeight& a, const QuantizedWeight& b) {
    return a.codes.scalar_type() == at::kInt && a.codes.equal(b.codes) && a.zeros.equal(b.zeros) &&
           a.scales.view(at::kInt).equal(b.scales.view(at::kInt)) && a.g_idx.equal(b.g_idx);
  };
  const QuantizeOptions base =
      quantize_options(4, 16, false, true, false, ZeroPointFormat::kGptqV1);
  std::vector<QuantizeOptions> settings(8, base);
  settings[1].bits = 3;
  settings[2].group_size = 32;
  settings[3].sym = true;
  settings[4].desc_act = false;
  settings[5].static_groups = true;
  // One row a group: a group of one positive weight has its range's low end at 0, where v1's
  // smallest zero (1) binds.
  settings[6].group_size = settings[7].group_size = 1;
  settings[7].min_zero = 0;
  // Each setting after the others are kept: a key that missed a field would hand out another's.
  for (int round = 0; round < 2; ++round) {
    for (const auto& o : settings) {
      auto got = quantize_seeded_layer(11, "p.", 64, 48, o);
      EXPECT_TRUE(same(got, fresh(o))) << "bits " << o.bits << " group " << o.group_size;
      got.codes.fill_(0);  // a caller's write (plant_edge_values writes codes)
      got.zeros.fill_(0);
    }
  }
  EXPECT_TRUE(same(quantize_seeded_layer(11, "p.", 64, 48, base), fresh(base)));
  EXPECT_TRUE(same(draw_seeded_layer(11, "p.", 64, 48, base), fresh(base)));
  // The layers were kept (the draws above were not all fresh), and let go on request.
  EXPECT_GT(kept_layer_bytes(), 0.0);
  drop_kept_layers();
  EXPECT_EQ(kept_layer_bytes(), 0.0);
  EXPECT_TRUE(same(quantize_seeded_layer(11, "p.", 64, 48, base), fresh(base)));
  EXPECT_FALSE(quantize_seeded_layer(12, "p.", 64, 48, base).codes.equal(fresh(base).codes));
  EXPECT_FALSE(quantize_seeded_layer(11, "q.", 64, 48, base).codes.equal(fresh(base).codes));
}

}  // namespace
}  // namespace gradscope

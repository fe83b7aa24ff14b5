// The rounding-noise model's propagation against finite-difference Jacobians: with every
// format exact (no rounding of its own), each building block's output variance must be
// sum_j J_ij^2 var_j for the reference op's Jacobian J, computed here by central differences
// of the reference itself. Then the rounding terms: a value rounded once has u^2 v^2 plus the
// subnormal term, and a product of exact inputs only its accumulation and output roundings.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <random>

#include "reference/layer_reference.h"
#include "reference/lora_reference.h"
#include "reference/rounding_noise.h"

namespace gradscope::reference {
namespace {

Matrix random_matrix(int64_t rows, int64_t cols, uint32_t seed, double scale = 1.0) {
  std::mt19937_64 gen(seed);
  std::normal_distribution<double> normal(0.0, scale);
  Matrix m(rows, cols);
  for (int64_t i = 0; i < m.size(); ++i) m.data()[i] = normal(gen);
  return m;
}

// Positive variances, one per element, spread over two decades.
Matrix random_variance(int64_t rows, int64_t cols, uint32_t seed) {
  return (random_matrix(rows, cols, seed).array() * 2.3).exp().matrix() * 1e-6;
}

// sum_j (d f_i / d x_j)^2 var_j by central differences of f at x.
Matrix propagated(const std::function<Matrix(const Matrix&)>& f, const Matrix& x,
                  const Matrix& var) {
  const Matrix y = f(x);
  Matrix out = Matrix::Zero(y.rows(), y.cols());
  for (int64_t j = 0; j < x.size(); ++j) {
    const double h = 1e-6 * std::max(1.0, std::abs(x.data()[j]));
    Matrix up = x, down = x;
    up.data()[j] += h;
    down.data()[j] -= h;
    const Matrix column = (f(up) - f(down)) / (2 * h);
    out += column.cwiseAbs2() * var.data()[j];
  }
  return out;
}

// Relative agreement of two variance matrices, elementwise (a floor of 1e-12 of the largest).
void expect_close(const Matrix& model, const Matrix& exact, double rtol, const char* what) {
  ASSERT_EQ(model.rows(), exact.rows()) << what;
  ASSERT_EQ(model.cols(), exact.cols()) << what;
  const double scale = exact.cwiseAbs().maxCoeff();
  ASSERT_GT(scale, 0) << what << ": the propagated variance is zero, nothing is checked";
  for (int64_t i = 0; i < model.size(); ++i) {
    const double m = model.data()[i], e = exact.data()[i];
    ASSERT_NEAR(m, e, rtol * std::abs(e) + 1e-12 * scale) << what << " at flat index " << i;
  }
}

const Format kExact{0, 0};

Projection small_projection(int64_t in, int64_t out, int64_t r, uint32_t seed) {
  Projection p;
  p.weight_t = random_matrix(in, out, seed, 0.1);
  p.bias = random_matrix(1, out, seed + 1, 0.1).row(0);
  p.lora_A = random_matrix(r, in, seed + 2, 0.3);
  p.lora_B = random_matrix(out, r, seed + 3, 0.3);
  p.scaling = 1.7;
  return p;
}

TEST(RoundingNoise, ProjectionPropagatesInputVariances) {
  const int64_t m = 5, in = 7, out = 6;
  const auto p = small_projection(in, out, 3, 11);
  Dropout d;
  d.p = 0.25;
  d.mask = (random_matrix(m, in, 12).array() > -0.6).cast<double>().matrix();
  const Matrix x = random_matrix(m, in, 13), dy = random_matrix(m, out, 14);
  const Matrix var_x = random_variance(m, in, 15), var_dy = random_variance(m, out, 16);
  RoundingNoise noise({kExact, kExact, kExact, kExact});
  const auto y = lora_forward(x, p, d);
  const auto fwd = noise.lora_forward(x, var_x, p, d, y, "p");
  expect_close(fwd.y, propagated([&](const Matrix& v) { return lora_forward(v, p, d); }, x, var_x),
               1e-6, "y from x");
  const auto grads = lora_backward(x, dy, p, d);
  // dx depends on dy only; dA and dB on both: check each input's share alone.
  const Matrix none;
  const auto from_dy = noise.lora_backward(x, none, dy, var_dy, p, d, fwd, grads, "p");
  expect_close(
      from_dy.dx,
      propagated([&](const Matrix& v) { return lora_backward(x, v, p, d).dx; }, dy, var_dy), 1e-6,
      "dx from dy");
  expect_close(
      from_dy.dA,
      propagated([&](const Matrix& v) { return lora_backward(x, v, p, d).dA; }, dy, var_dy), 1e-6,
      "dA from dy");
  const auto fwd_exact = noise.lora_forward(x, none, p, d, y, "p");
  const auto from_x = noise.lora_backward(x, var_x, dy, none, p, d, fwd, grads, "p");
  expect_close(from_x.dA,
               propagated([&](const Matrix& v) { return lora_backward(v, dy, p, d).dA; }, x, var_x),
               1e-6, "dA from x");
  // dB = s dY^T (X_d A^T): x reaches it through the forward's X_d A^T.
  expect_close(from_x.dB,
               propagated([&](const Matrix& v) { return lora_backward(v, dy, p, d).dB; }, x, var_x),
               1e-6, "dB from x");
  EXPECT_EQ(fwd_exact.y.cwiseAbs().maxCoeff(), 0.0);  // exact inputs, exact formats: no noise
}

TEST(RoundingNoise, SwigluPropagatesBothInputs) {
  const Matrix e = random_matrix(4, 5, 21, 3.0), g = random_matrix(4, 5, 22);
  const Matrix var_e = random_variance(4, 5, 23), var_g = random_variance(4, 5, 24);
  const Matrix none;
  expect_close(swiglu_variance(e, g, var_e, Matrix::Zero(4, 5), kExact, kExact),
               propagated([&](const Matrix& v) { return swiglu(v, g); }, e, var_e), 1e-6,
               "h from e");
  expect_close(swiglu_variance(e, g, Matrix::Zero(4, 5), var_g, kExact, kExact),
               propagated([&](const Matrix& v) { return swiglu(e, v); }, g, var_g), 1e-6,
               "h from g");
  const Matrix dh = random_matrix(4, 5, 25), var_dh = random_variance(4, 5, 26);
  const auto de_of = [&](const Matrix& ev, const Matrix& gv, const Matrix& dhv) {
    return swiglu_backward_variance(ev, gv, dhv, Matrix::Zero(4, 5), Matrix::Zero(4, 5),
                                    Matrix::Zero(4, 5), kExact, kExact);
  };
  const auto from_e = swiglu_backward_variance(e, g, dh, var_e, Matrix::Zero(4, 5),
                                               Matrix::Zero(4, 5), kExact, kExact);
  expect_close(from_e.var_de,
               propagated([&](const Matrix& v) { return de_of(v, g, dh).de; }, e, var_e), 1e-5,
               "de from e");
  expect_close(from_e.var_dg,
               propagated([&](const Matrix& v) { return de_of(v, g, dh).dg; }, e, var_e), 1e-5,
               "dg from e");
  const auto from_dh = swiglu_backward_variance(e, g, dh, Matrix::Zero(4, 5), Matrix::Zero(4, 5),
                                                var_dh, kExact, kExact);
  expect_close(from_dh.var_de,
               propagated([&](const Matrix& v) { return de_of(e, g, v).de; }, dh, var_dh), 1e-6,
               "de from dh");
}

TEST(RoundingNoise, RmsNormForwardAndBackward) {
  RmsNorm norm{random_matrix(1, 6, 31, 0.2).row(0).array() + 1.0, 1e-5};
  Matrix x = random_matrix(3, 6, 32);
  x(1, 2) = 40.0;  // an outlier channel: the mean's path dominates its row
  const Matrix var_x = random_variance(3, 6, 33), dy = random_matrix(3, 6, 34);
  const Matrix var_dy = random_variance(3, 6, 35);
  const Matrix none;
  expect_close(rmsnorm_variance(x, var_x, norm, kExact, kExact),
               propagated([&](const Matrix& v) { return rmsnorm_forward(v, norm); }, x, var_x),
               1e-5, "rmsnorm from x");
  expect_close(
      rmsnorm_backward_variance(x, none, dy, var_dy, norm, kExact, kExact),
      propagated([&](const Matrix& v) { return rmsnorm_backward(x, v, norm); }, dy, var_dy), 1e-5,
      "rmsnorm backward from dy");
  expect_close(rmsnorm_backward_variance(x, var_x, dy, none, norm, kExact, kExact),
               propagated([&](const Matrix& v) { return rmsnorm_backward(v, dy, norm); }, x, var_x),
               1e-5, "rmsnorm backward from x");
}

TEST(RoundingNoise, RopeAndItsTranspose) {
  AttentionShape s{1, 4, 2, 2, 4};
  s.position_offset = 3000;
  const Matrix x = random_matrix(4, 8, 41), var_x = random_variance(4, 8, 42);
  expect_close(rope_variance(x, var_x, s, 2, 1.0, kExact, kExact),
               propagated([&](const Matrix& v) { return rope_forward(v, s, 2); }, x, var_x), 1e-6,
               "rope");
  expect_close(rope_variance(x, var_x, s, 2, -1.0, kExact, kExact),
               propagated([&](const Matrix& v) { return rope_backward(v, s, 2); }, x, var_x), 1e-6,
               "rope backward");
}

// A row's query error (and, in the backward, its output gradient's) reaches every score of
// the row at once: there the model takes a Cauchy-Schwarz bound over the keys instead of the
// exact sum (docs/verification.md). A bound must hold at every element and, summed over the
// block, stay within a small factor of the exact first-order variance.
void expect_bound(const Matrix& model, const Matrix& exact, const char* what) {
  for (int64_t i = 0; i < model.size(); ++i) {
    EXPECT_GE(model.data()[i], exact.data()[i] * (1 - 1e-6)) << what << " at flat index " << i;
  }
  EXPECT_LE(model.sum(), 8.0 * exact.sum()) << what;
}

TEST(RoundingNoise, AttentionForwardAndBackward) {
  const AttentionShape s{1, 5, 2, 1, 4};  // two query heads share one key/value head
  const Matrix q = random_matrix(5, 8, 51), k = random_matrix(5, 4, 52),
               v = random_matrix(5, 4, 53);
  const Matrix dout = random_matrix(5, 8, 54);
  const Matrix vq = random_variance(5, 8, 55), vk = random_variance(5, 4, 56);
  const Matrix vv = random_variance(5, 4, 57), vdo = random_variance(5, 8, 58);
  const Matrix z8 = Matrix::Zero(5, 8), z4 = Matrix::Zero(5, 4);
  const auto fwd = [&](const Matrix& qv, const Matrix& kv, const Matrix& vv2) {
    return attention_forward(qv, kv, vv2, s);
  };
  expect_close(attention_forward_variance(q, k, v, z8, z4, vv, s, kExact, kExact),
               propagated([&](const Matrix& m) { return fwd(q, k, m); }, v, vv), 1e-5, "o from v");
  expect_close(attention_forward_variance(q, k, v, z8, vk, z4, s, kExact, kExact),
               propagated([&](const Matrix& m) { return fwd(q, m, v); }, k, vk), 1e-5, "o from k");
  expect_bound(attention_forward_variance(q, k, v, vq, z4, z4, s, kExact, kExact),
               propagated([&](const Matrix& m) { return fwd(m, k, v); }, q, vq), "o from q");
  const auto bwd = [&](const Matrix& dov) { return attention_backward(q, k, v, dov, s); };
  const auto from_dout =
      attention_backward_variance(q, k, v, dout, z8, z4, z4, vdo, s, kExact, kExact);
  expect_close(from_dout.dv, propagated([&](const Matrix& m) { return bwd(m).dv; }, dout, vdo),
               1e-5, "dv from dout");
  expect_close(from_dout.dk, propagated([&](const Matrix& m) { return bwd(m).dk; }, dout, vdo),
               1e-5, "dk from dout (two heads summed)");
  expect_bound(from_dout.dq, propagated([&](const Matrix& m) { return bwd(m).dq; }, dout, vdo),
               "dq from dout");
  const auto from_v = attention_backward_variance(q, k, v, dout, z8, z4, vv, z8, s, kExact, kExact);
  expect_close(
      from_v.dq,
      propagated([&](const Matrix& m) { return attention_backward(q, k, m, dout, s).dq; }, v, vv),
      1e-5, "dq from v");
}

// Attention is taken a tile of query rows at a time against only the keys those rows can
// attend; the masked keys' exact zeros still carry the activation format's subnormal term,
// added from their sums. Any tile size must give the single-tile values up to rounding, with
// a subnormal term large enough here that dropping the masked keys' share would show.
TEST(RoundingNoise, AttentionTileSizeChangesNoValue) {
  const AttentionShape s{2, 19, 4, 2, 4};  // 19 tokens: tiles of 1, 4, 7 leave partial tiles
  const int64_t rows = 2 * 19;
  const Matrix q = random_matrix(rows, 16, 71), k = random_matrix(rows, 8, 72),
               v = random_matrix(rows, 8, 73), dout = random_matrix(rows, 16, 74);
  const Matrix vq = random_variance(rows, 16, 75), vk = random_variance(rows, 8, 76),
               vv = random_variance(rows, 8, 77), vdo = random_variance(rows, 16, 78);
  const Format act{0x1.0p-11, 1e-3}, acc{0x1.0p-24, 1e-20};
  const auto same = [](const Matrix& tiled, const Matrix& whole, const std::string& what) {
    ASSERT_EQ(tiled.rows(), whole.rows()) << what;
    for (int64_t i = 0; i < whole.size(); ++i) {
      ASSERT_NEAR(tiled.data()[i], whole.data()[i], 1e-12 * std::abs(whole.data()[i]))
          << what << " at flat index " << i;
    }
  };
  double whole_max = 0;
  const Matrix fwd = attention_forward_variance(q, k, v, vq, vk, vv, s, act, acc, &whole_max, 19);
  const auto bwd = attention_backward_variance(q, k, v, dout, vq, vk, vv, vdo, s, act, acc, 19);
  for (const int64_t tile : {int64_t{1}, int64_t{4}, int64_t{7}, kAttentionTileRows}) {
    const std::string t = "tile of " + std::to_string(tile) + " rows: ";
    double max_score = 0;
    same(attention_forward_variance(q, k, v, vq, vk, vv, s, act, acc, &max_score, tile), fwd,
         t + "output variance");
    EXPECT_NEAR(max_score, whole_max, 1e-12 * whole_max) << t << "largest score";
    const auto g = attention_backward_variance(q, k, v, dout, vq, vk, vv, vdo, s, act, acc, tile);
    same(g.dq, bwd.dq, t + "dq variance");
    same(g.dk, bwd.dk, t + "dk variance");
    same(g.dv, bwd.dv, t + "dv variance");
    same(g.dq_value, bwd.dq_value, t + "dq");
    same(g.dk_value, bwd.dk_value, t + "dk");
    same(g.dv_value, bwd.dv_value, t + "dv");
    // The forward, asked, finds the backward's largest score error: one measure of the scores.
    ScoreError forward;
    attention_forward_variance(q, k, v, vq, vk, vv, s, act, acc, nullptr, tile, &forward);
    for (const auto& [e, side] : {std::pair{g.scores, "backward"}, std::pair{forward, "forward"}}) {
      EXPECT_NEAR(e.sigma, bwd.scores.sigma, 1e-12 * bwd.scores.sigma) << t << side;
      EXPECT_EQ(e.batch, bwd.scores.batch) << t << side;
      EXPECT_EQ(e.head, bwd.scores.head) << t << side;
      EXPECT_EQ(e.query, bwd.scores.query) << t << side;
      EXPECT_EQ(e.key, bwd.scores.key) << t << side;
    }
  }
}

// With exact inputs and accumulation a score's only error is its own rounding, u |S_ij|: the
// largest score error is u times the largest unmasked |S|, found over every head and batch,
// and a larger score at a masked key (which no implementation's softmax reads), even the one
// just past the diagonal, is not it; at any tile size, tiles starting past row 0 included.
TEST(RoundingNoise, AttentionFindsItsLargestScoreError) {
  const AttentionShape s{2, 6, 4, 2, 4};
  const int64_t rows = 2 * 6;
  Matrix q = random_matrix(rows, 16, 91), k = random_matrix(rows, 8, 92);
  const Matrix v = random_matrix(rows, 8, 93), dout = random_matrix(rows, 16, 94);
  // Batch 1, head 3 (kv head 1): query 4 against key 2 unmasked; query 4 against key 5 and
  // query 1 against key 2 masked, all far above every other score.
  q.block(6 + 4, 12, 1, 4).setConstant(20.0);
  k.block(6 + 2, 4, 1, 4).setConstant(8.0);
  q.block(6 + 1, 12, 1, 4).setConstant(-24.0);
  k.block(6 + 5, 4, 1, 4).setConstant(16.0);
  const Matrix z16 = Matrix::Zero(rows, 16), z8 = Matrix::Zero(rows, 8);
  const Format act{0x1.0p-8, 0}, acc{0, 0};
  const double score = q.block(6 + 4, 12, 1, 4).cwiseProduct(k.block(6 + 2, 4, 1, 4)).sum() / 2.0;
  for (const int64_t tile : {int64_t{1}, int64_t{2}, int64_t{4}, kAttentionTileRows}) {
    const auto e =
        attention_backward_variance(q, k, v, dout, z16, z8, z8, z16, s, act, acc, tile).scores;
    const std::string t = "tile of " + std::to_string(tile) + " rows";
    EXPECT_EQ(e.batch, 1) << t;
    EXPECT_EQ(e.head, 3) << t;
    EXPECT_EQ(e.query, 4) << t;
    EXPECT_EQ(e.key, 2) << t;
    EXPECT_NEAR(e.score, score, 1e-12 * score) << t;
    EXPECT_NEAR(e.sigma, 0x1.0p-8 * score, 1e-12 * score) << t;
  }
  EXPECT_GT(0x1.0p-8 * score, kScoreSigmaFirstOrder);  // 320 * 2^-8: past the first order
  // A NaN in the scores' variance is the largest error: the model has failed there.
  Matrix vq = z16;
  vq(6 + 3, 13) = NAN;
  const auto nan = attention_backward_variance(q, k, v, dout, vq, z8, z8, z16, s, act, acc).scores;
  EXPECT_TRUE(std::isnan(nan.sigma));
  EXPECT_EQ(nan.batch, 1);
  EXPECT_EQ(nan.head, 3);
  EXPECT_EQ(nan.query, 3);
  EXPECT_EQ(nan.key, 0);  // the first of its row's scores the NaN reaches
}

// Every stored probability, a masked key's exact zero included, carries the activation
// format's subnormal term into O through V^2 (docs/verification.md). Row 0 attends to key 0
// alone (its own spread about O_0 = V_0 is zero), so the subnormal term adds exactly
// sub^2 (sum over all keys of V_jd^2 + 1: O's own rounding) to its variance.
TEST(RoundingNoise, AttentionCountsEveryKeysSubnormalTerm) {
  const AttentionShape s{1, 9, 1, 1, 4};
  const Matrix q = random_matrix(9, 4, 81), k = random_matrix(9, 4, 82),
               v = random_matrix(9, 4, 83);
  const Matrix exact = Matrix::Zero(9, 4);
  const double sub = 1e-3;
  const Format with{0x1.0p-11, sub}, without{0x1.0p-11, 0}, acc{0x1.0p-24, 0};
  for (const int64_t tile : {int64_t{1}, int64_t{4}, int64_t{9}}) {
    const Matrix a =
        attention_forward_variance(q, k, v, exact, exact, exact, s, with, acc, nullptr, tile);
    const Matrix b =
        attention_forward_variance(q, k, v, exact, exact, exact, s, without, acc, nullptr, tile);
    for (int64_t d = 0; d < 4; ++d) {
      const double expected = sub * sub * (v.col(d).squaredNorm() + 1);
      EXPECT_NEAR(a(0, d) - b(0, d), expected, 1e-9 * expected)
          << "tile of " << tile << " rows, column " << d;
    }
  }
}

TEST(RoundingNoise, RoundingTermsOfOneProjection) {
  // Exact inputs and exact weights in a format with u = 2^-11 and no subnormal term: the
  // output's variance is the weight rounding (u^2 sum_k x_k^2 W_kj^2) plus the stored
  // results, never zero, and it scales with u^2.
  const auto p = small_projection(8, 4, 2, 61);
  const Matrix x = random_matrix(3, 8, 62);
  const Dropout none;
  const Format half{0x1.0p-11, 0};
  const Format acc{0, 0};
  RoundingNoise a({half, half, half, acc}),
      b({Format{0x1.0p-12, 0}, Format{0x1.0p-12, 0}, Format{0x1.0p-12, 0}, acc});
  const Matrix y = lora_forward(x, p, none);
  const Matrix va = a.lora_forward(x, Matrix(), p, none, y, "p").y;
  const Matrix vb = b.lora_forward(x, Matrix(), p, none, y, "p").y;
  const Matrix weight_term = (x.cwiseAbs2() * p.weight_t.cwiseAbs2()) * std::pow(0x1.0p-11, 2);
  for (int64_t i = 0; i < va.size(); ++i) {
    EXPECT_GE(va.data()[i], weight_term.data()[i]);
    EXPECT_NEAR(va.data()[i] / vb.data()[i], 4.0, 1e-9);  // halving u quarters every term
  }
}

}  // namespace
}  // namespace gradscope::reference

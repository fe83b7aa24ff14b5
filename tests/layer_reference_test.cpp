// The decoder-layer pieces of the fp64 reference (RMSNorm, RoPE, causal GQA attention,
// the whole layer) against central finite differences, like the LoRA ops. No torch.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <stdexcept>
#include <string>

#include "reference/layer_reference.h"
#include "reference_grad_check.h"

namespace gradscope::reference {
namespace {

using testing::dot;
using testing::expect_directional;
using testing::random_layer;
using testing::random_norm;
using testing::Rng;

// batch 2, seq 5, 4 query heads over 2 key/value heads of width 4: GQA and the causal
// mask both matter, and every position gets a different rotation.
const AttentionShape kShape{2, 5, 4, 2, 4};

TEST(LayerReferenceGrad, RmsNorm) {
  Rng rng(1);
  Matrix x = rng.normal(6, 8);
  const Matrix dy = rng.normal(6, 8);
  const auto norm = random_norm(rng, 8);
  const Matrix dx = rmsnorm_backward(x, dy, norm);
  expect_directional([&] { return dot(dy, rmsnorm_forward(x, norm)); }, x, dx, rng, "dx");
}

TEST(LayerReferenceGrad, RopeIsARotation) {
  Rng rng(2);
  const int64_t width = kShape.heads * kShape.head_dim;
  Matrix x = rng.normal(kShape.batch * kShape.seq, width);
  const Matrix dy = rng.normal(x.rows(), width);
  const Matrix y = rope_forward(x, kShape, kShape.heads);
  EXPECT_NEAR(y.norm(), x.norm(), 1e-12);                 // rotations keep lengths
  EXPECT_NEAR((y.row(0) - x.row(0)).norm(), 0.0, 1e-15);  // position 0 is not rotated
  EXPECT_GT((y.row(1) - x.row(1)).norm(), 1e-3);
  const Matrix dx = rope_backward(dy, kShape, kShape.heads);
  expect_directional([&] { return dot(dy, rope_forward(x, kShape, kShape.heads)); }, x, dx, rng,
                     "dx");
}

// By tiles of query rows (1; 2: tiles 2, 2 and a tail of 1; 3; one tile of the whole sequence):
// each tiling's gradients pass the finite differences, and the tilings agree to fp64 rounding.
// A tile of no rows is refused.
TEST(LayerReferenceGrad, CausalGroupedQueryAttention) {
  Rng rng(3);
  const int64_t rows = kShape.batch * kShape.seq;
  Matrix q = rng.normal(rows, kShape.heads * kShape.head_dim);
  Matrix k = rng.normal(rows, kShape.kv_heads * kShape.head_dim);
  Matrix v = rng.normal(rows, kShape.kv_heads * kShape.head_dim);
  const Matrix dout = rng.normal(rows, q.cols());
  const Matrix whole_out = attention_forward(q, k, v, kShape, kShape.seq);
  const auto whole = attention_backward(q, k, v, dout, kShape, kShape.seq);
  for (const int64_t tile : {int64_t{1}, int64_t{2}, int64_t{3}, kShape.seq}) {
    SCOPED_TRACE("tile_rows " + std::to_string(tile));
    const auto g = attention_backward(q, k, v, dout, kShape, tile);
    const auto f = [&] { return dot(dout, attention_forward(q, k, v, kShape, tile)); };
    expect_directional(f, q, g.dq, rng, "dq");
    expect_directional(f, k, g.dk, rng, "dk");
    expect_directional(f, v, g.dv, rng, "dv");
    const Matrix out = attention_forward(q, k, v, kShape, tile);
    EXPECT_LE((out - whole_out).norm(), 1e-14 * whole_out.norm());
    EXPECT_LE((g.dq - whole.dq).norm(), 1e-14 * whole.dq.norm());
    EXPECT_LE((g.dk - whole.dk).norm(), 1e-14 * whole.dk.norm());
    EXPECT_LE((g.dv - whole.dv).norm(), 1e-14 * whole.dv.norm());
    // Causality: the first token of a sequence attends to itself only.
    EXPECT_NEAR((out.block(0, 0, 1, kShape.head_dim) - v.block(0, 0, 1, kShape.head_dim)).norm(),
                0.0, 1e-12);
  }
  EXPECT_THROW(attention_forward(q, k, v, kShape, 0), std::invalid_argument);
  EXPECT_THROW(attention_backward(q, k, v, dout, kShape, 0), std::invalid_argument);
}

// The reference spreads attention over (batch, head) and sums each key/value head's shares
// in head order afterwards: one thread and several give the same bits.
TEST(LayerReference, AttentionDoesNotDependOnTheThreadCount) {
  Rng rng(4);
  // A key/value group spans threads; two sequences; tiles of 8 rows leave a tail of 6.
  const AttentionShape shape{2, 30, 8, 2, 8};
  const int64_t rows = shape.batch * shape.seq;
  const Matrix q = rng.normal(rows, shape.heads * shape.head_dim);
  const Matrix k = rng.normal(rows, shape.kv_heads * shape.head_dim);
  const Matrix v = rng.normal(rows, shape.kv_heads * shape.head_dim);
  const Matrix dout = rng.normal(rows, q.cols());
  const int threads = omp_get_max_threads();
  omp_set_num_threads(1);
  const Matrix out1 = attention_forward(q, k, v, shape, /*tile_rows=*/8);
  const auto g1 = attention_backward(q, k, v, dout, shape, 8);
  omp_set_num_threads(4);
  const Matrix out4 = attention_forward(q, k, v, shape, 8);
  const auto g4 = attention_backward(q, k, v, dout, shape, 8);
  omp_set_num_threads(threads);
  EXPECT_TRUE(out1 == out4);
  EXPECT_TRUE(g1.dq == g4.dq);
  EXPECT_TRUE(g1.dk == g4.dk);
  EXPECT_TRUE(g1.dv == g4.dv);
}

// The whole layer's gradients; `shape` and `l` carry a family's parts (docs/model-families.md).
void expect_layer_gradients(Rng& rng, const AttentionShape& shape, Layer& l) {
  const int64_t hidden = shape.heads * shape.head_dim, rows = shape.batch * shape.seq;
  Matrix x = rng.normal(rows, hidden);
  const Matrix dy = rng.normal(rows, hidden);
  const auto g = layer_backward(x, dy, l, shape);
  const auto f = [&] { return dot(dy, layer_forward(x, l, shape)); };
  expect_directional(f, x, g.dx, rng, "dx");
  const std::pair<Projection*, const ProjectionGrads*> projections[] = {
      {&l.q, &g.q},       {&l.k, &g.k},   {&l.v, &g.v},      {&l.o, &g.o},
      {&l.gate, &g.gate}, {&l.up, &g.up}, {&l.down, &g.down}};
  for (const auto& [p, pg] : projections) {
    expect_directional(f, p->lora_A, pg->dA, rng, "dA");
    expect_directional(f, p->lora_B, pg->dB, rng, "dB");
  }
}

TEST(LayerReferenceGrad, WholeLayer) {
  Rng rng(4);
  Layer l = random_layer(rng, kShape, /*intermediate=*/24, /*rank=*/3);
  expect_layer_gradients(rng, kShape, l);
}

// Granite's parts: the scores scaled by a configured factor, each residual branch by a
// multiplier.
TEST(LayerReferenceGrad, WholeLayerWithScaledScoresAndResidualBranches) {
  Rng rng(5);
  AttentionShape shape = kShape;
  shape.scaling = 0.3;
  Layer l = random_layer(rng, shape, /*intermediate=*/24, /*rank=*/3);
  l.residual_multiplier = 0.22;
  expect_layer_gradients(rng, shape, l);
  // The parts change the layer: neither is a no-op.
  const Matrix x = rng.normal(shape.batch * shape.seq, shape.heads * shape.head_dim);
  Layer plain = l;
  plain.residual_multiplier = 1.0;
  EXPECT_GT((layer_forward(x, l, shape) - layer_forward(x, plain, shape)).norm(), 1e-3);
  EXPECT_GT((layer_forward(x, l, shape) - layer_forward(x, l, kShape)).norm(), 1e-3);
  EXPECT_DOUBLE_EQ(attention_scale(kShape), 0.5);
  EXPECT_DOUBLE_EQ(attention_scale(shape), 0.3);
}

// Llama 3's frequency scaling: long wavelengths divided by the factor, short ones kept, the
// band between blended so that the frequency is continuous at both of its edges; the layer's
// gradients through it.
TEST(LayerReferenceGrad, Llama3RopeScaling) {
  AttentionShape shape{1, 6, 2, 1, 128};
  shape.rope_theta = 500000.0;
  shape.rope_scaling = {true, 8.0, 1.0, 4.0, 8192.0};
  AttentionShape plain = shape;
  plain.rope_scaling.llama3 = false;
  EXPECT_EQ(rope_frequency(shape, 0), rope_frequency(plain, 0));  // wavelength 2 pi: kept
  EXPECT_DOUBLE_EQ(rope_frequency(shape, 63), rope_frequency(plain, 63) / 8.0);
  const double f32 = rope_frequency(plain, 32), wavelength = 2 * M_PI / f32;
  ASSERT_GT(wavelength, 8192.0 / 4.0);
  ASSERT_LT(wavelength, 8192.0 / 1.0);
  const double scaled = rope_frequency(shape, 32);
  EXPECT_GT(scaled, f32 / 8.0);
  EXPECT_LT(scaled, f32);
  // Continuous at the band's edges: a shape whose high-frequency edge sits at pair 32's
  // wavelength keeps it; one whose low-frequency edge does divides it by the factor.
  AttentionShape at_high = shape, at_low = shape;
  at_high.rope_scaling.high_freq_factor = 8192.0 / wavelength;
  at_low.rope_scaling.low_freq_factor = 8192.0 / wavelength;
  at_low.rope_scaling.high_freq_factor = at_low.rope_scaling.low_freq_factor * 4;
  EXPECT_NEAR(rope_frequency(at_high, 32), f32, 1e-12 * f32);
  EXPECT_NEAR(rope_frequency(at_low, 32), f32 / 8.0, 1e-12 * f32);

  Rng rng(6);
  AttentionShape layer_shape{2, 5, 4, 2, 4};
  layer_shape.rope_theta = 500000.0;   // pair 1's wavelength, about 4443, in the blended band
  layer_shape.position_offset = 7000;  // positions where the scaled frequencies matter
  layer_shape.rope_scaling = {true, 8.0, 1.0, 4.0, 8192.0};
  Layer l = random_layer(rng, layer_shape, /*intermediate=*/24, /*rank=*/3);
  expect_layer_gradients(rng, layer_shape, l);
}

// The check is not vacuous: dropping RMSNorm's second term is caught.
TEST(LayerReferenceGradCheck, DetectsAnRmsNormBackwardWithoutItsMeanTerm) {
  Rng rng(5);
  Matrix x = rng.normal(3, 8);
  const Matrix dy = rng.normal(3, 8);
  const auto norm = random_norm(rng, 8);
  Matrix wrong(3, 8);
  for (int64_t t = 0; t < 3; ++t) {
    const double r = 1.0 / std::sqrt(x.row(t).squaredNorm() / 8 + norm.eps);
    wrong.row(t) = r * dy.row(t).cwiseProduct(norm.weight);
  }
  const Matrix v = rng.normal(3, 8);
  const double eps = 1e-6;
  const Matrix saved = x;
  x = saved + eps * v;
  const double plus = dot(dy, rmsnorm_forward(x, norm));
  x = saved - eps * v;
  const double minus = dot(dy, rmsnorm_forward(x, norm));
  EXPECT_GT(std::abs((plus - minus) / (2 * eps) - dot(wrong, v)), 1e-3);
}

}  // namespace
}  // namespace gradscope::reference

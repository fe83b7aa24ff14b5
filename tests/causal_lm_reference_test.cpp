// The training pieces of the fp64 reference: the causal LM's mean next-token loss against
// finite differences for every layer's adapters, and AdamW against steps worked by hand.
// No torch (the comparison with torch's AdamW is in training_test.cpp).
#include <gtest/gtest.h>

#include <cmath>

#include "reference/causal_lm_reference.h"
#include "reference_grad_check.h"

namespace gradscope::reference {
namespace {

using testing::expect_directional;
using testing::random_layer;
using testing::random_norm;
using testing::Rng;

const AttentionShape kShape{2, 4, 2, 1, 4};
constexpr int64_t kVocab = 11;

CausalLm random_model(Rng& rng, int64_t layers) {
  CausalLm m;
  const int64_t hidden = kShape.heads * kShape.head_dim;
  m.shape = kShape;
  m.embedding = rng.normal(kVocab, hidden);
  for (int64_t i = 0; i < layers; ++i) m.layers.push_back(random_layer(rng, kShape, 12, 2));
  m.final_norm = random_norm(rng, hidden);
  m.lm_head = rng.normal(kVocab, hidden, 0.5);
  return m;
}

std::vector<int64_t> random_tokens(Rng& rng, int64_t n) {
  std::vector<int64_t> t(n);
  const Matrix u = rng.normal(n, 1);
  for (int64_t i = 0; i < n; ++i) {
    t[i] = static_cast<int64_t>(std::floor(std::abs(u(i, 0)) * 1000)) % kVocab;
  }
  return t;
}

TEST(CausalLmReferenceGrad, MeanLossWrtEveryAdapter) {
  Rng rng(11);
  CausalLm m = random_model(rng, 2);
  const int64_t rows = kShape.batch * kShape.seq;
  const auto tokens = random_tokens(rng, rows), targets = random_tokens(rng, rows);
  const auto result = causal_lm_backward(m, tokens, targets);
  const auto& grads = result.grads;
  ASSERT_EQ(grads.size(), 2u);
  EXPECT_NEAR((result.losses - token_losses(m, tokens, targets)).norm(), 0.0, 1e-15);
  const auto mean_loss = [&] { return token_losses(m, tokens, targets).mean(); };
  for (size_t i = 0; i < 2; ++i) {
    auto& l = m.layers[i];
    const auto& g = grads[i];
    const std::pair<Projection*, const ProjectionGrads*> projections[] = {
        {&l.q, &g.q},       {&l.k, &g.k},   {&l.v, &g.v},      {&l.o, &g.o},
        {&l.gate, &g.gate}, {&l.up, &g.up}, {&l.down, &g.down}};
    for (const auto& [p, pg] : projections) {
      expect_directional(mean_loss, p->lora_A, pg->dA, rng, "dA");
      expect_directional(mean_loss, p->lora_B, pg->dB, rng, "dB");
    }
  }
}

TEST(CausalLmReference, UniformLogitsGiveLogVocab) {
  Rng rng(12);
  CausalLm m = random_model(rng, 1);
  m.lm_head.setZero();
  const int64_t rows = kShape.batch * kShape.seq;
  const auto losses = token_losses(m, random_tokens(rng, rows), random_tokens(rng, rows));
  for (int64_t t = 0; t < rows; ++t) EXPECT_NEAR(losses(t), std::log(double(kVocab)), 1e-14);
}

TEST(CausalLmReference, TokenOutsideTheVocabularyIsRefused) {
  Rng rng(13);
  const CausalLm m = random_model(rng, 1);
  std::vector<int64_t> tokens(kShape.batch * kShape.seq, 0), targets = tokens;
  tokens[3] = kVocab;
  EXPECT_THROW(token_losses(m, tokens, targets), std::out_of_range);
}

TEST(AdamWReference, StepsWorkedByHand) {
  // Step 1: m_hat = g and v_hat = g^2, so the update is lr g / (|g| + eps) after the
  // decoupled decay p (1 - lr wd).
  const AdamWConfig config{0.9, 0.999, 1e-8, 0.1};
  Matrix p(1, 3), g(1, 3);
  p << 1.0, -2.0, 0.5;
  g << 0.25, -4.0, 0.0;
  AdamWState state;
  adamw_step(p, g, state, 0.01, config);
  EXPECT_NEAR(p(0, 0), 1.0 * (1 - 0.001) - 0.01 * 0.25 / (0.25 + 1e-8), 1e-15);
  EXPECT_NEAR(p(0, 1), -2.0 * (1 - 0.001) + 0.01 * 4.0 / (4.0 + 1e-8), 1e-15);
  EXPECT_DOUBLE_EQ(p(0, 2), 0.5 * (1 - 0.001));  // no gradient: decay only
  // Step 2 with the same gradient: m = g (1 - b1^2) and v = g^2 (1 - b2^2) after bias
  // correction are g and g^2 again, so the update has the same size.
  const double before = p(0, 0);
  adamw_step(p, g, state, 0.01, config);
  EXPECT_NEAR(p(0, 0), before * (1 - 0.001) - 0.01 * 0.25 / (0.25 + 1e-8), 1e-15);
  EXPECT_EQ(state.steps, 2);
}

}  // namespace
}  // namespace gradscope::reference

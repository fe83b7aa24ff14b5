// The fp64 reference's hand-written backward against central finite differences
// along random directions (the VJP identity <dY, J v> = <J^T dY, v>), for every op.
// No torch here: this file links only the reference.
#include <gtest/gtest.h>

#include <functional>
#include <random>

#include "reference/lora_reference.h"
#include "reference_grad_check.h"

namespace gradscope::reference {
namespace {

using testing::dot;
using testing::expect_directional;
using testing::random_projection;
using testing::Rng;

class LoraReferenceGrad : public ::testing::TestWithParam<std::tuple<double, bool>> {};

TEST_P(LoraReferenceGrad, LoraW) {
  const auto [p, bias] = GetParam();
  Rng rng(1);
  Matrix x = rng.normal(5, 6);
  Projection proj = random_projection(rng, 6, 4, 3, bias);
  const Dropout d{p, rng.mask(5, 6, p)};
  const Matrix dy = rng.normal(5, 4);
  const auto g = lora_backward(x, dy, proj, d);
  const auto f = [&] { return dot(dy, lora_forward(x, proj, d)); };
  expect_directional(f, x, g.dx, rng, "dx");
  expect_directional(f, proj.lora_A, g.dA, rng, "dA");
  expect_directional(f, proj.lora_B, g.dB, rng, "dB");
}

TEST_P(LoraReferenceGrad, Qkv) {
  const auto [p, bias] = GetParam();
  Rng rng(2);
  Matrix x = rng.normal(5, 8);
  Projection q = random_projection(rng, 8, 8, 2, bias), k = random_projection(rng, 8, 4, 2, bias),
             v = random_projection(rng, 8, 4, 3, bias);
  const Dropout d{p, rng.mask(5, 8, p)};
  const Matrix dq = rng.normal(5, 8), dk = rng.normal(5, 4), dv = rng.normal(5, 4);
  const auto g = qkv_backward(x, dq, dk, dv, q, k, v, d);
  const auto f = [&] {
    const auto o = qkv_forward(x, q, k, v, d);
    return dot(dq, o.q) + dot(dk, o.k) + dot(dv, o.v);
  };
  expect_directional(f, x, g.dx, rng, "dx");
  expect_directional(f, q.lora_A, g.q.dA, rng, "q dA");
  expect_directional(f, k.lora_B, g.k.dB, rng, "k dB");
  expect_directional(f, v.lora_A, g.v.dA, rng, "v dA");
  expect_directional(f, v.lora_B, g.v.dB, rng, "v dB");
}

TEST_P(LoraReferenceGrad, Mlp) {
  const auto [p, bias] = GetParam();
  Rng rng(3);
  Matrix x = rng.normal(4, 6);
  Projection gate = random_projection(rng, 6, 7, 2, bias),
             up = random_projection(rng, 6, 7, 3, bias),
             down = random_projection(rng, 7, 6, 2, bias);
  const Dropout dx{p, rng.mask(4, 6, p)}, dh{p, rng.mask(4, 7, p)};
  const Matrix dy = rng.normal(4, 6);
  const auto g = mlp_backward(x, dy, gate, up, down, dx, dh);
  const auto f = [&] { return dot(dy, mlp_forward(x, gate, up, down, dx, dh)); };
  expect_directional(f, x, g.dx, rng, "dx");
  for (auto* proj : {&gate, &up, &down}) {
    const auto& pg = proj == &gate ? g.gate : proj == &up ? g.up : g.down;
    expect_directional(f, proj->lora_A, pg.dA, rng, "dA");
    expect_directional(f, proj->lora_B, pg.dB, rng, "dB");
  }
}

INSTANTIATE_TEST_SUITE_P(DropoutAndBias, LoraReferenceGrad,
                         ::testing::Combine(::testing::Values(0.0, 0.3), ::testing::Bool()));

// The check itself must be able to fail: a backward missing the dropout rescale.
TEST(LoraReferenceGradCheck, DetectsAMissingDropoutRescale) {
  Rng rng(4);
  Matrix x = rng.normal(5, 6);
  Projection proj = random_projection(rng, 6, 4, 3, false);
  const Dropout d{0.3, rng.mask(5, 6, 0.3)};
  const Matrix dy = rng.normal(5, 4);
  auto g = lora_backward(x, dy, proj, d);
  g.dx = dy * proj.weight_t.transpose() +
         (proj.scaling * dy * proj.lora_B * proj.lora_A).cwiseProduct(d.mask);
  const Matrix v = rng.normal(5, 6);
  const double eps = 1e-6;
  const double numeric =
      (dot(dy, lora_forward(x + eps * v, proj, d)) - dot(dy, lora_forward(x - eps * v, proj, d))) /
      (2 * eps);
  EXPECT_GT(std::abs(numeric - dot(g.dx, v)), 1e-3);
}

}  // namespace
}  // namespace gradscope::reference

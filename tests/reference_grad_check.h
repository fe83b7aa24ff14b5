// Finite-difference checking of the fp64 reference's hand-written backward: random
// inputs and directions, and the VJP identity <dY, J v> = <J^T dY, v>. No torch.
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <random>

#include "reference/layer_reference.h"

namespace gradscope::reference::testing {

class Rng {
 public:
  explicit Rng(unsigned seed) : gen_(seed) {}
  Matrix normal(int64_t rows, int64_t cols, double stddev = 1.0) {
    Matrix m(rows, cols);
    for (int64_t i = 0; i < m.size(); ++i) m.data()[i] = stddev * dist_(gen_);
    return m;
  }
  Matrix mask(int64_t rows, int64_t cols, double p) {
    std::bernoulli_distribution keep(1.0 - p);
    Matrix m(rows, cols);
    for (int64_t i = 0; i < m.size(); ++i) m.data()[i] = keep(gen_) ? 1.0 : 0.0;
    return m;
  }

 private:
  std::mt19937_64 gen_;
  std::normal_distribution<double> dist_;
};

inline Projection random_projection(Rng& rng, int64_t in, int64_t out, int64_t r, bool bias) {
  Projection p;
  p.weight_t = rng.normal(in, out, 0.3);
  if (bias) p.bias = rng.normal(1, out).row(0);
  p.lora_A = rng.normal(r, in, 0.5);
  p.lora_B = rng.normal(out, r, 0.5);
  p.scaling = 1.7;
  return p;
}

inline RmsNorm random_norm(Rng& rng, int64_t width) {
  RmsNorm n;
  n.weight = (1.0 + 0.3 * rng.normal(1, width).array()).matrix().row(0);
  n.eps = 1e-5;
  return n;
}

inline Layer random_layer(Rng& rng, const AttentionShape& s, int64_t intermediate, int64_t r) {
  const int64_t hidden = s.heads * s.head_dim, kv = s.kv_heads * s.head_dim;
  Layer l;
  l.input_norm = random_norm(rng, hidden);
  l.post_attention_norm = random_norm(rng, hidden);
  l.q = random_projection(rng, hidden, hidden, r, false);
  l.k = random_projection(rng, hidden, kv, r, false);
  l.v = random_projection(rng, hidden, kv, r, false);
  l.o = random_projection(rng, hidden, hidden, r, false);
  l.gate = random_projection(rng, hidden, intermediate, r, false);
  l.up = random_projection(rng, hidden, intermediate, r, false);
  l.down = random_projection(rng, intermediate, hidden, r, false);
  return l;
}

inline double dot(const Matrix& a, const Matrix& b) {
  return a.cwiseProduct(b).sum();
}

// Compares <grad, v> with the central difference of F along v, where the
// perturbed input is `input` and F(input) = <dY, f(inputs)>.
inline void expect_directional(const std::function<double()>& objective, Matrix& input,
                               const Matrix& grad, Rng& rng, const char* what) {
  const Matrix v = rng.normal(input.rows(), input.cols());
  const double eps = 1e-6;
  const Matrix saved = input;
  input = saved + eps * v;
  const double plus = objective();
  input = saved - eps * v;
  const double minus = objective();
  input = saved;
  const double numeric = (plus - minus) / (2 * eps);
  const double analytic = dot(grad, v);
  // Central differences in fp64: truncation ~eps^2, cancellation ~1e-16/eps, both far
  // below 1e-6 relative; a wrong formula is off by O(1).
  EXPECT_NEAR(numeric, analytic, 1e-6 * (std::abs(analytic) + 1.0)) << what;
}

}  // namespace gradscope::reference::testing

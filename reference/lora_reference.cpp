#include "reference/lora_reference.h"

#include <cmath>

#include "reference/dense_product.h"
#include "reference/row_parallel.h"

namespace gradscope::reference {

Matrix dropped(const Matrix& x, const Dropout& d) {
  if (d.p == 0) return x;
  // By rows over the threads: the same product per element.
  Matrix out(x.rows(), x.cols());
  for_each_row(x.rows(),
               [&](int64_t t) { out.row(t) = x.row(t).cwiseProduct(d.mask.row(t)) / (1.0 - d.p); });
  return out;
}

namespace {

// Elementwise a + b, by rows over the threads (a 70B MLP's sums are too large for one core).
Matrix sum(const Matrix& a, const Matrix& b) {
  Matrix out(a.rows(), a.cols());
  for_each_row(a.rows(), [&](int64_t t) { out.row(t) = a.row(t) + b.row(t); });
  return out;
}

}  // namespace

// The adapter terms are accumulated into the base product by the GEMM itself (beta = 1):
// no full-size temporary and no serial elementwise pass over [tokens, out] for them.
Matrix lora_forward(const Matrix& x, const Projection& p, const Dropout& d) {
  Matrix y(x.rows(), p.weight_t.cols());
  gemm(1.0, x, Op::kPlain, p.weight_t, Op::kPlain, 0.0, y);
  if (p.bias.size() > 0) for_each_row(y.rows(), [&](int64_t t) { y.row(t) += p.bias; });
  // X_d A^T, [M, r]
  const Matrix xa = product(d.p == 0 ? x : dropped(x, d), Op::kPlain, p.lora_A, Op::kTransposed);
  gemm(p.scaling, xa, Op::kPlain, p.lora_B, Op::kTransposed, 1.0, y);
  return y;
}

ProjectionGrads lora_backward(const Matrix& x, const Matrix& dy, const Projection& p,
                              const Dropout& d) {
  Matrix dropped_x;  // only with dropout: X itself otherwise (no copy of a large input)
  if (d.p != 0) dropped_x = dropped(x, d);
  const Matrix& xd = d.p == 0 ? x : dropped_x;
  const Matrix dyb = product(dy, Op::kPlain, p.lora_B, Op::kPlain, p.scaling);  // s dY B, [M, r]
  ProjectionGrads g;
  g.dx.resize(dy.rows(), p.weight_t.rows());
  gemm(1.0, dy, Op::kPlain, p.weight_t, Op::kTransposed, 0.0, g.dx);
  // The adapter's input is X_d = X * m / (1 - p): its gradient goes back through the same factor.
  if (d.p == 0) {
    gemm(1.0, dyb, Op::kPlain, p.lora_A, Op::kPlain, 1.0, g.dx);
  } else {
    const Matrix term = dropped(product(dyb, p.lora_A), d);
    for_each_row(g.dx.rows(), [&](int64_t t) { g.dx.row(t) += term.row(t); });
  }
  g.dA = product(dyb, Op::kTransposed, xd, Op::kPlain);
  g.dB = product(dy, Op::kTransposed, product(xd, Op::kPlain, p.lora_A, Op::kTransposed),
                 Op::kPlain, p.scaling);
  return g;
}

QkvOutputs qkv_forward(const Matrix& x, const Projection& q, const Projection& k,
                       const Projection& v, const Dropout& d) {
  return {lora_forward(x, q, d), lora_forward(x, k, d), lora_forward(x, v, d)};
}

QkvGrads qkv_backward(const Matrix& x, const Matrix& dq, const Matrix& dk, const Matrix& dv,
                      const Projection& q, const Projection& k, const Projection& v,
                      const Dropout& d) {
  QkvGrads g;
  g.q = lora_backward(x, dq, q, d);
  g.k = lora_backward(x, dk, k, d);
  g.v = lora_backward(x, dv, v, d);
  g.dx = sum(sum(g.q.dx, g.k.dx), g.v.dx);
  return g;
}

namespace {
double sigmoid(double e) {
  return 1.0 / (1.0 + std::exp(-e));
}
}  // namespace

Matrix swiglu(const Matrix& e, const Matrix& g) {
  Matrix h(e.rows(), e.cols());
  for_each_row(e.rows(), [&](int64_t t) {
    for (int64_t n = 0; n < e.cols(); ++n) h(t, n) = e(t, n) * sigmoid(e(t, n)) * g(t, n);
  });
  return h;
}

Matrix mlp_forward(const Matrix& x, const Projection& gate, const Projection& up,
                   const Projection& down, const Dropout& dx, const Dropout& dh) {
  const Matrix h = swiglu(lora_forward(x, gate, dx), lora_forward(x, up, dx));
  return lora_forward(h, down, dh);
}

MlpTape mlp_tape(const Matrix& x, const Projection& gate, const Projection& up, const Dropout& dx) {
  return {lora_forward(x, gate, dx), lora_forward(x, up, dx)};
}

MlpGrads mlp_backward(const Matrix& x, const Matrix& dy, const Projection& gate,
                      const Projection& up, const Projection& down, const Dropout& dx,
                      const Dropout& dh) {
  return mlp_backward(mlp_tape(x, gate, up, dx), x, dy, gate, up, down, dx, dh);
}

MlpGrads mlp_backward(const MlpTape& tape, const Matrix& x, const Matrix& dy,
                      const Projection& gate, const Projection& up, const Projection& down,
                      const Dropout& dx, const Dropout& dh) {
  const Matrix& e = tape.e;
  const Matrix& g = tape.g;
  const Matrix h = swiglu(e, g);
  MlpGrads grads;
  grads.down = lora_backward(h, dy, down, dh);
  const Matrix& dhv = grads.down.dx;
  // h = silu(e) g: dg = dh silu(e); de = dh g silu'(e) with
  // silu'(e) = sigma(e) (1 + e (1 - sigma(e))).
  Matrix dg(e.rows(), e.cols()), de(e.rows(), e.cols());
  for_each_row(e.rows(), [&](int64_t t) {
    for (int64_t n = 0; n < e.cols(); ++n) {
      const double v = e(t, n), sig = sigmoid(v);
      dg(t, n) = dhv(t, n) * v * sig;
      de(t, n) = dhv(t, n) * g(t, n) * (sig * (1.0 + v * (1.0 - sig)));
    }
  });
  grads.up = lora_backward(x, dg, up, dx);
  grads.gate = lora_backward(x, de, gate, dx);
  grads.dx = sum(grads.up.dx, grads.gate.dx);
  return grads;
}

}  // namespace gradscope::reference

#include "reference/lora_reference.h"

#include <cmath>

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

// The adapter terms are accumulated into the base product by the GEMM itself (noalias
// +=): no full-size temporary and no serial elementwise pass over [tokens, out] for them.
Matrix lora_forward(const Matrix& x, const Projection& p, const Dropout& d) {
  Matrix y(x.rows(), p.weight_t.cols());
  y.noalias() = x * p.weight_t;
  if (p.bias.size() > 0) y.rowwise() += p.bias;
  Matrix xa;  // X_d A^T, [M, r]
  if (d.p == 0) {
    xa.noalias() = x * p.lora_A.transpose();
  } else {
    xa.noalias() = dropped(x, d) * p.lora_A.transpose();
  }
  y.noalias() += (p.scaling * xa) * p.lora_B.transpose();
  return y;
}

ProjectionGrads lora_backward(const Matrix& x, const Matrix& dy, const Projection& p,
                              const Dropout& d) {
  Matrix dropped_x;  // only with dropout: X itself otherwise (no copy of a large input)
  if (d.p != 0) dropped_x = dropped(x, d);
  const Matrix& xd = d.p == 0 ? x : dropped_x;
  const Matrix dyb = p.scaling * (dy * p.lora_B);  // s dY B, [M, r]
  ProjectionGrads g;
  g.dx.noalias() = dy * p.weight_t.transpose();
  // The adapter's input is X_d = X * m / (1 - p): its gradient goes back through the same factor.
  if (d.p == 0) {
    g.dx.noalias() += dyb * p.lora_A;
  } else {
    g.dx += dropped(dyb * p.lora_A, d);
  }
  g.dA.noalias() = dyb.transpose() * xd;
  g.dB.noalias() = p.scaling * dy.transpose() * (xd * p.lora_A.transpose());
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

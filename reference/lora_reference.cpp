#include "reference/lora_reference.h"

#include <cmath>

namespace gradscope::reference {

Matrix dropped(const Matrix& x, const Dropout& d) {
  if (d.p == 0) return x;
  return x.cwiseProduct(d.mask) / (1.0 - d.p);
}

Matrix lora_forward(const Matrix& x, const Projection& p, const Dropout& d) {
  Matrix y = x * p.weight_t;
  if (p.bias.size() > 0) y.rowwise() += p.bias;
  y += p.scaling * (dropped(x, d) * p.lora_A.transpose()) * p.lora_B.transpose();
  return y;
}

ProjectionGrads lora_backward(const Matrix& x, const Matrix& dy, const Projection& p,
                              const Dropout& d) {
  const Matrix xd = dropped(x, d);
  const Matrix dyb = dy * p.lora_B;  // [M, r]
  ProjectionGrads g;
  // The adapter's input is X_d = X * m / (1 - p): its gradient goes back through the same factor.
  g.dx = dy * p.weight_t.transpose() + dropped(p.scaling * dyb * p.lora_A, d);
  g.dA = p.scaling * dyb.transpose() * xd;
  g.dB = p.scaling * dy.transpose() * (xd * p.lora_A.transpose());
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
  g.dx = g.q.dx + g.k.dx + g.v.dx;
  return g;
}

namespace {
double sigmoid(double e) {
  return 1.0 / (1.0 + std::exp(-e));
}
}  // namespace

Matrix swiglu(const Matrix& e, const Matrix& g) {
  return e.unaryExpr([](double v) { return v * sigmoid(v); }).cwiseProduct(g);
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
  const Matrix sig = e.unaryExpr([](double v) { return sigmoid(v); });
  const Matrix silu = e.cwiseProduct(sig);
  const Matrix dg = dhv.cwiseProduct(silu);
  // d silu / de = sigma(e) (1 + e (1 - sigma(e)))
  const Matrix dsilu = sig.cwiseProduct(
      (Matrix::Ones(e.rows(), e.cols()) + e.cwiseProduct(Matrix::Ones(e.rows(), e.cols()) - sig)));
  const Matrix de = dhv.cwiseProduct(g).cwiseProduct(dsilu);
  grads.up = lora_backward(x, dg, up, dx);
  grads.gate = lora_backward(x, de, gate, dx);
  grads.dx = grads.up.dx + grads.gate.dx;
  return grads;
}

}  // namespace gradscope::reference

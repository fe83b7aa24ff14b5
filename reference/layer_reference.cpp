#include "reference/layer_reference.h"

#include <cmath>
#include <limits>
#include <vector>

#include "reference/dense_product.h"
#include "reference/row_parallel.h"

namespace gradscope::reference {

Matrix rmsnorm_forward(const Matrix& x, const RmsNorm& norm) {
  Matrix y(x.rows(), x.cols());
  for_each_row(x.rows(), [&](int64_t t) {
    const double r = 1.0 / std::sqrt(x.row(t).squaredNorm() / x.cols() + norm.eps);
    y.row(t) = (x.row(t) * r).cwiseProduct(norm.weight);
  });
  return y;
}

Matrix rmsnorm_backward(const Matrix& x, const Matrix& dy, const RmsNorm& norm) {
  // y = x r w with r = (mean(x^2) + eps)^(-1/2): dx = r (dy w) - x r^3 <dy w, x> / D.
  Matrix dx(x.rows(), x.cols());
  const double d = static_cast<double>(x.cols());
  for_each_row(x.rows(), [&](int64_t t) {
    const double r = 1.0 / std::sqrt(x.row(t).squaredNorm() / d + norm.eps);
    const Eigen::RowVectorXd g = dy.row(t).cwiseProduct(norm.weight);
    dx.row(t) = r * g - x.row(t) * (r * r * r * g.dot(x.row(t)) / d);
  });
  return dx;
}

namespace {

// Rotation by +angle (forward) or -angle (backward, the transpose).
Matrix rotate(const Matrix& x, const AttentionShape& s, int64_t heads, double sign) {
  Matrix y(x.rows(), x.cols());
  const int64_t d = s.head_dim, half = d / 2;
  for_each_row(x.rows(), [&](int64_t row) {
    const double position = static_cast<double>(row % s.seq + s.position_offset);
    for (int64_t i = 0; i < half; ++i) {
      const double angle = position * std::pow(s.rope_theta, -2.0 * i / d);
      const double c = std::cos(angle), sn = sign * std::sin(angle);
      for (int64_t h = 0; h < heads; ++h) {
        const double a = x(row, h * d + i), b = x(row, h * d + i + half);
        y(row, h * d + i) = a * c - b * sn;
        y(row, h * d + i + half) = b * c + a * sn;
      }
    }
  });
  return y;
}

}  // namespace

Matrix rope_forward(const Matrix& x, const AttentionShape& s, int64_t heads) {
  return rotate(x, s, heads, 1.0);
}

Matrix rope_backward(const Matrix& dy, const AttentionShape& s, int64_t heads) {
  return rotate(dy, s, heads, -1.0);
}

namespace {

// Row-softmax probabilities of one (batch, head) block, causal.
Matrix causal_probabilities(const Matrix& q, const Matrix& k, double scale) {
  const int64_t n = q.rows();
  Matrix p = product(q, Op::kPlain, k, Op::kTransposed, scale);
  for (int64_t i = 0; i < n; ++i) {
    double m = -std::numeric_limits<double>::infinity();
    for (int64_t j = 0; j <= i; ++j) m = std::max(m, p(i, j));
    double sum = 0;
    for (int64_t j = 0; j < n; ++j) {
      p(i, j) = j <= i ? std::exp(p(i, j) - m) : 0.0;
      sum += p(i, j);
    }
    p.row(i) /= sum;
  }
  return p;
}

}  // namespace

Matrix attention_forward(const Matrix& q, const Matrix& k, const Matrix& v,
                         const AttentionShape& s) {
  Matrix out = Matrix::Zero(q.rows(), q.cols());
  const int64_t d = s.head_dim, group = s.heads / s.kv_heads;
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  // One (batch, head) per thread: each writes its own block of out.
  for_each_row(s.batch * s.heads, [&](int64_t bh) {
    const int64_t b = bh / s.heads, h = bh % s.heads, g = h / group;
    const Matrix qh = q.block(b * s.seq, h * d, s.seq, d);
    const Matrix kg = k.block(b * s.seq, g * d, s.seq, d);
    const Matrix vg = v.block(b * s.seq, g * d, s.seq, d);
    out.block(b * s.seq, h * d, s.seq, d) = product(causal_probabilities(qh, kg, scale), vg);
  });
  return out;
}

AttentionGrads attention_backward(const Matrix& q, const Matrix& k, const Matrix& v,
                                  const Matrix& dout, const AttentionShape& s) {
  AttentionGrads g{Matrix::Zero(q.rows(), q.cols()), Matrix::Zero(k.rows(), k.cols()),
                   Matrix::Zero(v.rows(), v.cols())};
  const int64_t d = s.head_dim, group = s.heads / s.kv_heads;
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  // One (batch, query head) per thread. The heads of a group share k and v: each head's
  // share of dk and dv is kept apart and the shares are summed afterwards in head order,
  // so the result does not depend on the thread count.
  std::vector<Matrix> dk_parts(s.batch * s.heads), dv_parts(s.batch * s.heads);
  for_each_row(s.batch * s.heads, [&](int64_t bh) {
    const int64_t b = bh / s.heads, h = bh % s.heads, kv = h / group;
    const Matrix qh = q.block(b * s.seq, h * d, s.seq, d);
    const Matrix kg = k.block(b * s.seq, kv * d, s.seq, d);
    const Matrix vg = v.block(b * s.seq, kv * d, s.seq, d);
    const Matrix doh = dout.block(b * s.seq, h * d, s.seq, d);
    const Matrix p = causal_probabilities(qh, kg, scale);
    // O = P V; dP = dO V^T; dS = P * (dP - rowsum(dP * P)) (softmax); S = Q K^T scale.
    const Matrix dp = product(doh, Op::kPlain, vg, Op::kTransposed);
    const Eigen::VectorXd rows = dp.cwiseProduct(p).rowwise().sum();
    const Matrix ds = p.cwiseProduct(dp.colwise() - rows);
    g.dq.block(b * s.seq, h * d, s.seq, d) = product(ds, Op::kPlain, kg, Op::kPlain, scale);
    dk_parts[bh] = product(ds, Op::kTransposed, qh, Op::kPlain, scale);
    dv_parts[bh] = product(p, Op::kTransposed, doh, Op::kPlain);
  });
  for_each_row(s.batch * s.kv_heads, [&](int64_t bkv) {
    const int64_t b = bkv / s.kv_heads, kv = bkv % s.kv_heads;
    for (int64_t h = kv * group; h < (kv + 1) * group; ++h) {
      g.dk.block(b * s.seq, kv * d, s.seq, d) += dk_parts[b * s.heads + h];
      g.dv.block(b * s.seq, kv * d, s.seq, d) += dv_parts[b * s.heads + h];
    }
  });
  return g;
}

LayerTape layer_tape(const Matrix& x, const Layer& l, const AttentionShape& s) {
  const Dropout none;
  LayerTape t;
  t.n1 = rmsnorm_forward(x, l.input_norm);
  const auto qkv = qkv_forward(t.n1, l.q, l.k, l.v, none);
  t.q = qkv.q;
  t.k = qkv.k;
  t.v = qkv.v;
  t.qr = rope_forward(t.q, s, s.heads);
  t.kr = rope_forward(t.k, s, s.kv_heads);
  t.attn = attention_forward(t.qr, t.kr, t.v, s);
  t.h = x + lora_forward(t.attn, l.o, none);
  t.n2 = rmsnorm_forward(t.h, l.post_attention_norm);
  t.mlp = mlp_tape(t.n2, l.gate, l.up, none);
  t.out = t.h + lora_forward(swiglu(t.mlp.e, t.mlp.g), l.down, none);
  return t;
}

Matrix layer_forward(const Matrix& x, const Layer& layer, const AttentionShape& s) {
  return layer_tape(x, layer, s).out;
}

LayerGrads layer_backward(const Matrix& x, const Matrix& dy, const Layer& l,
                          const AttentionShape& s) {
  return layer_backward(layer_tape(x, l, s), x, dy, l, s);
}

LayerGrads layer_backward(const LayerTape& t, const Matrix& x, const Matrix& dy, const Layer& l,
                          const AttentionShape& s) {
  const Dropout none;
  LayerGrads g;
  const auto mlp = mlp_backward(t.mlp, t.n2, dy, l.gate, l.up, l.down, none, none);
  g.gate = mlp.gate;
  g.up = mlp.up;
  g.down = mlp.down;
  const Matrix dh = dy + rmsnorm_backward(t.h, mlp.dx, l.post_attention_norm);
  g.o = lora_backward(t.attn, dh, l.o, none);
  const auto attn = attention_backward(t.qr, t.kr, t.v, g.o.dx, s);
  const auto qkv =
      qkv_backward(t.n1, rope_backward(attn.dq, s, s.heads), rope_backward(attn.dk, s, s.kv_heads),
                   attn.dv, l.q, l.k, l.v, none);
  g.q = qkv.q;
  g.k = qkv.k;
  g.v = qkv.v;
  g.dx = dh + rmsnorm_backward(x, qkv.dx, l.input_norm);
  return g;
}

}  // namespace gradscope::reference

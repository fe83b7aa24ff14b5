#include "reference/layer_reference.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>
#include <utility>
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
      const double angle = position * rope_frequency(s, i);
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

void check_tile_rows(int64_t tile_rows) {
  if (tile_rows < 1) {
    throw std::invalid_argument("reference attention: tile_rows must be at least 1, got " +
                                std::to_string(tile_rows));
  }
}

// The row-softmax probabilities of query rows [i0, i1) of one (batch, head) block over the keys
// they may attend, [0, i1): every later key is masked for all of them, so the tile's products
// skip the masked half of the block, whose probabilities are exact zeros. Row r holds query
// i0 + r: keys past it are zero.
Matrix causal_probabilities(const Matrix& q, const Matrix& k, int64_t i0, int64_t i1,
                            double scale) {
  const int64_t m = i1 - i0;
  Matrix p = product(Matrix(q.middleRows(i0, m)), Op::kPlain, Matrix(k.topRows(i1)),
                     Op::kTransposed, scale);
  for (int64_t r = 0; r < m; ++r) {
    const int64_t i = i0 + r;
    double mx = -std::numeric_limits<double>::infinity();
    for (int64_t j = 0; j <= i; ++j) mx = std::max(mx, p(r, j));
    double sum = 0;
    for (int64_t j = 0; j < i1; ++j) {
      p(r, j) = j <= i ? std::exp(p(r, j) - mx) : 0.0;
      sum += p(r, j);
    }
    p.row(r) /= sum;
  }
  return p;
}

}  // namespace

double rope_frequency(const AttentionShape& s, int64_t i) {
  const double f = std::pow(s.rope_theta, -2.0 * static_cast<double>(i) / s.head_dim);
  const RopeScaling& r = s.rope_scaling;
  if (!r.llama3) return f;
  const double wavelength = 2 * M_PI / f;
  if (wavelength < r.original_max_position / r.high_freq_factor) return f;
  if (wavelength > r.original_max_position / r.low_freq_factor) return f / r.factor;
  const double smooth = (r.original_max_position / wavelength - r.low_freq_factor) /
                        (r.high_freq_factor - r.low_freq_factor);
  return (1 - smooth) * f / r.factor + smooth * f;
}

double attention_scale(const AttentionShape& s) {
  return s.scaling > 0 ? s.scaling : 1.0 / std::sqrt(static_cast<double>(s.head_dim));
}

Matrix attention_forward(const Matrix& q, const Matrix& k, const Matrix& v, const AttentionShape& s,
                         int64_t tile_rows) {
  check_tile_rows(tile_rows);
  Matrix out = Matrix::Zero(q.rows(), q.cols());
  const int64_t d = s.head_dim, n = s.seq, group = s.heads / s.kv_heads;
  const double scale = attention_scale(s);
  // One (batch, head) per thread: each writes its own block of out.
  for_each_row(s.batch * s.heads, [&](int64_t bh) {
    const int64_t b = bh / s.heads, h = bh % s.heads, g = h / group;
    const Matrix qh = q.block(b * n, h * d, n, d);
    const Matrix kg = k.block(b * n, g * d, n, d);
    const Matrix vg = v.block(b * n, g * d, n, d);
    for (int64_t i0 = 0; i0 < n; i0 += tile_rows) {
      const int64_t i1 = std::min(n, i0 + tile_rows);
      out.block(b * n + i0, h * d, i1 - i0, d) =
          product(causal_probabilities(qh, kg, i0, i1, scale), Matrix(vg.topRows(i1)));
    }
  });
  return out;
}

AttentionGrads attention_backward(const Matrix& q, const Matrix& k, const Matrix& v,
                                  const Matrix& dout, const AttentionShape& s, int64_t tile_rows) {
  check_tile_rows(tile_rows);
  AttentionGrads g{Matrix::Zero(q.rows(), q.cols()), Matrix::Zero(k.rows(), k.cols()),
                   Matrix::Zero(v.rows(), v.cols())};
  const int64_t d = s.head_dim, n = s.seq, group = s.heads / s.kv_heads;
  const double scale = attention_scale(s);
  // One (batch, query head) per thread. The heads of a group share k and v: each head's
  // share of dk and dv is kept apart and the shares are summed afterwards in head order,
  // so the result does not depend on the thread count.
  std::vector<Matrix> dk_parts(s.batch * s.heads), dv_parts(s.batch * s.heads);
  for_each_row(s.batch * s.heads, [&](int64_t bh) {
    const int64_t b = bh / s.heads, h = bh % s.heads, kv = h / group;
    const Matrix qh = q.block(b * n, h * d, n, d);
    const Matrix kg = k.block(b * n, kv * d, n, d);
    const Matrix vg = v.block(b * n, kv * d, n, d);
    Matrix dk = Matrix::Zero(n, d), dv = Matrix::Zero(n, d);
    for (int64_t i0 = 0; i0 < n; i0 += tile_rows) {
      const int64_t i1 = std::min(n, i0 + tile_rows), m = i1 - i0;
      const Matrix p = causal_probabilities(qh, kg, i0, i1, scale);
      const Matrix keys = kg.topRows(i1), values = vg.topRows(i1);
      const Matrix q_t = qh.middleRows(i0, m), do_t = dout.block(b * n + i0, h * d, m, d);
      // O = P V; dP = dO V^T; dS = P * (dP - rowsum(dP * P)) (softmax); S = Q K^T scale.
      const Matrix dp = product(do_t, Op::kPlain, values, Op::kTransposed);
      const Eigen::VectorXd rows = dp.cwiseProduct(p).rowwise().sum();
      const Matrix ds = p.cwiseProduct(dp.colwise() - rows);
      g.dq.block(b * n + i0, h * d, m, d) = product(ds, Op::kPlain, keys, Op::kPlain, scale);
      dk.topRows(i1) += product(ds, Op::kTransposed, q_t, Op::kPlain, scale);
      dv.topRows(i1) += product(p, Op::kTransposed, do_t, Op::kPlain);
    }
    dk_parts[bh] = std::move(dk);
    dv_parts[bh] = std::move(dv);
  });
  for_each_row(s.batch * s.kv_heads, [&](int64_t bkv) {
    const int64_t b = bkv / s.kv_heads, kv = bkv % s.kv_heads;
    for (int64_t h = kv * group; h < (kv + 1) * group; ++h) {
      g.dk.block(b * n, kv * d, n, d) += dk_parts[b * s.heads + h];
      g.dv.block(b * n, kv * d, n, d) += dv_parts[b * s.heads + h];
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
  const double m = l.residual_multiplier;
  t.h = x + m * lora_forward(t.attn, l.o, none);
  t.n2 = rmsnorm_forward(t.h, l.post_attention_norm);
  t.mlp = mlp_tape(t.n2, l.gate, l.up, none);
  t.out = t.h + m * lora_forward(swiglu(t.mlp.e, t.mlp.g), l.down, none);
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
  // Each residual branch's gradient is m times its sum's.
  const double m = l.residual_multiplier;
  const auto mlp = mlp_backward(t.mlp, t.n2, m * dy, l.gate, l.up, l.down, none, none);
  g.gate = mlp.gate;
  g.up = mlp.up;
  g.down = mlp.down;
  const Matrix dh = dy + rmsnorm_backward(t.h, mlp.dx, l.post_attention_norm);
  g.o = lora_backward(t.attn, m * dh, l.o, none);
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

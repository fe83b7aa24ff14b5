#include "reference/rounding_noise.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "reference/dense_product.h"
#include "reference/row_parallel.h"

namespace gradscope::reference {
namespace {

// A coefficient-wise expression (each element from the same elements of its operands: no
// reduction, no product) evaluated row by row over the threads: each element is the same
// expression on the same operands as one plain assignment gives. The variances of a real-shape
// layer are matrices of up to hundreds of millions of elements, and Eigen runs coefficient-wise
// expressions on one core; small ones stay there (a parallel region costs more than they do).
template <class Expr>
Matrix by_rows(const Expr& e) {
  Matrix out(e.rows(), e.cols());
  if (out.size() < (int64_t{1} << 16)) {
    out = e;
  } else {
    for_each_row(out.rows(), [&](int64_t t) { out.row(t) = e.row(t); });
  }
  return out;
}

// dst += e, by rows (the same rule as by_rows).
template <class Expr>
void add_by_rows(Matrix& dst, const Expr& e) {
  if (dst.size() < (int64_t{1} << 16)) {
    dst += e;
  } else {
    for_each_row(dst.rows(), [&](int64_t t) { dst.row(t) += e.row(t); });
  }
}

Matrix sq(const Matrix& a) {
  return by_rows(a.cwiseAbs2());
}

// a + b where either may be empty (an exact value has no variance matrix).
Matrix plus(const Matrix& a, const Matrix& b) {
  if (a.size() == 0) return b;
  if (b.size() == 0) return a;
  return by_rows(a + b);
}

// u^2 K / 2: the accumulation term's factor for sums of K terms in format f.
double accumulation(const Format& f, int64_t k) {
  return f.unit_roundoff * f.unit_roundoff * static_cast<double>(k) / 2.0;
}

// K terms each flushed to zero below the format's normal range (f.subnormal), random signs.
double flushed(const Format& f, int64_t k) {
  return f.subnormal * f.subnormal * static_cast<double>(k);
}

// One operand of a product whose variance is wanted: its value as stored, the op applied to it,
// and optionally its variance (same layout; absent: exact) and its square (when the caller
// already has it: a large square is computed once per projection, not once per product).
struct Operand {
  const Matrix& value;
  Op op = Op::kPlain;
  const Matrix* var = nullptr;
  const Matrix* squared = nullptr;
};

// alpha times the variance of the computed product op(A) op(B) before it is stored, for op(A)
// [M, K] and op(B) [K, N]: the operands' errors carried through the product,
// var_A (B o B) + (A o A) var_B, and the accumulation's own, u^2 K/2 ((A o A)(B o B) + (AB)^2),
// with AB = ab_factor * ab (`ab` the product as the reference holds it, e.g. scaled).
// (c (A o A) + var_A) shares one product with (B o B); with A exact, (A o A) multiplies
// (c (B o B) + var_B) once.
Matrix product_variance(const Operand& a, const Operand& b, const Matrix& ab, double ab_factor,
                        const Format& acc, double alpha = 1.0) {
  const int64_t k = a.op == Op::kPlain ? a.value.cols() : a.value.rows();
  const double c = accumulation(acc, k);
  Matrix sa_own, sb_own;
  const Matrix& sa = a.squared ? *a.squared : (sa_own = sq(a.value));
  const Matrix& sb = b.squared ? *b.squared : (sb_own = sq(b.value));
  const double c_ab = alpha * c * ab_factor * ab_factor, f = alpha * flushed(acc, k);
  Matrix v = by_rows(((c_ab * ab.cwiseAbs2()).array() + f).matrix());
  if (a.var) {
    gemm(alpha, by_rows(c * sa + *a.var), a.op, sb, b.op, 1.0, v);
    if (b.var) gemm(alpha, sa, a.op, *b.var, b.op, 1.0, v);
  } else if (b.var) {
    gemm(alpha, sa, a.op, by_rows(c * sb + *b.var), b.op, 1.0, v);
  } else {
    gemm(alpha * c, sa, a.op, sb, b.op, 1.0, v);
  }
  return v;
}

// The same for X op(W), X exact (an input, or a value whose error is carried apart) given as
// its square x2, with the dequantized weight W rounded once into `weight` (var_W =
// u^2 W^2 + subnormal^2, never materialised): one product with (W o W) serves every term.
// The product's own rounding into `stored` is added in the same pass.
Matrix weight_product_variance(const Matrix& x2, const Matrix& w, Op op_w, const Matrix& xw,
                               const Format& weight, const Format& acc, const Format& stored) {
  const double c = accumulation(acc, x2.cols());
  const double u2 = weight.unit_roundoff * weight.unit_roundoff;
  const double su2 = stored.unit_roundoff * stored.unit_roundoff;
  const double constant = flushed(acc, x2.cols()) + stored.subnormal * stored.subnormal;
  // The weight's subnormal term: sub^2 sum_k X_ik^2 for every output of row i.
  Eigen::VectorXd row_terms = Eigen::VectorXd::Constant(x2.rows(), constant);
  if (weight.subnormal > 0) {
    const double sw2 = weight.subnormal * weight.subnormal;
    for_each_row(x2.rows(), [&](int64_t t) { row_terms(t) += sw2 * x2.row(t).sum(); });
  }
  Matrix v = by_rows((((c + su2) * xw.cwiseAbs2()).array().colwise() + row_terms.array()).matrix());
  gemm_nonnegative(c + u2, x2, Op::kPlain, w, op_w, v, /*square_b=*/true);
  return v;
}

// Variance of X_d = X * mask / (1 - p) from that of X (with dropout).
Matrix dropped_variance(const Matrix& var_x, const Dropout& d) {
  return by_rows(var_x.cwiseProduct(d.mask) / ((1 - d.p) * (1 - d.p)));
}

// 1 / s for s != 0: the factor that unscales a scaled product (s = 0 leaves nothing to scale).
double unscale(double s) {
  return s == 0 ? 1.0 : 1.0 / s;
}

double sigmoid(double e) {
  return 1.0 / (1.0 + std::exp(-e));
}

}  // namespace

Matrix rounding_variance(const Matrix& v, const Format& f) {
  const double u2 = f.unit_roundoff * f.unit_roundoff, s2 = f.subnormal * f.subnormal;
  return by_rows(((u2 * v.cwiseAbs2()).array() + s2).matrix());
}

void RoundingNoise::store(const std::string& name, const Matrix& v) {
  // The largest |v| by rows over the threads: a maximum is the same in any order.
  std::vector<double> row_max(v.rows(), 0.0);
  if (v.cols() > 0)
    for_each_row(v.rows(), [&](int64_t t) { row_max[t] = v.row(t).cwiseAbs().maxCoeff(); });
  const double m = row_max.empty() ? 0.0 : *std::max_element(row_max.begin(), row_max.end());
  for (auto& s : stored_) {
    if (s.name == name) {
      s.max_abs = std::max(s.max_abs, m);
      return;
    }
  }
  stored_.push_back({name, m});
}

// An input error reaches a projection's output through the base weight and the adapter
// together: dY_ij = sum_k dX_ik (W_kj + s c_ik M_kj), with M = A^T B^T [in, out] and c the
// dropout factor mask / (1 - p) of element ik. Its variance, from var_x [rows, in] (or, with
// `transposed`, from var_dy [rows, out] through W^T, c then applying to the output element):
//   without dropout  var (W + s M)^2
//   with dropout     var W^2 + 2 s (var c) (W o M) + s^2 (var c^2) (M o M)   (c on var's side)
//                    V1 + 2 s c o V2 + s^2 c^2 o V3                          (transposed)
// Two paths that share one error add before they are squared: summing their variances apart
// would be wrong by up to a factor 2 either way. Added to `out`.
void add_composite_variance(Matrix& out, const Matrix& var, const Projection& p, const Dropout& d,
                            bool transposed) {
  const double s = p.scaling;
  const Op op = transposed ? Op::kTransposed : Op::kPlain;
  if (d.p == 0) {
    // (W + s A^T B^T)^2, formed block by block inside the product: no weight-sized copy.
    const Matrix left = p.lora_A.transpose(), right = p.lora_B.transpose();  // [in, r], [r, out]
    gemm_nonnegative(1.0, var, Op::kPlain, NonnegativeOperand{p.weight_t, true, &left, &right, s},
                     op, out);
    return;
  }
  const Matrix m = product(p.lora_A, Op::kTransposed, p.lora_B, Op::kTransposed);  // [in, out]
  const double c = 1.0 / (1.0 - d.p);
  const Matrix w2 = sq(p.weight_t), wm = by_rows(p.weight_t.cwiseProduct(m)), m2 = sq(m);
  gemm_nonnegative(1.0, var, Op::kPlain, w2, op, out);
  if (!transposed) {
    const Matrix vm = by_rows(var.cwiseProduct(d.mask));
    gemm(2 * s * c, vm, Op::kPlain, wm, Op::kPlain, 1.0, out);
    gemm(s * s * c * c, vm, Op::kPlain, m2, Op::kPlain, 1.0, out);
    return;
  }
  const Matrix vwm = product(var, Op::kPlain, wm, op);
  add_by_rows(out, (2 * s * c) * d.mask.cwiseProduct(vwm));
  const Matrix vm2 = product(var, Op::kPlain, m2, op);
  add_by_rows(out, (s * s * c * c) * d.mask.cwiseProduct(vm2));
}

// Forward of one projection, Y = X W^T + b + s (X_d A^T) B^T, as a careful implementation
// computes it: P = X W in the activation format, the adapter term L = s (X_d A^T) B^T in the
// adapter compute format and rounded into the activation format, then P + b + L.
ProjectionForwardNoise RoundingNoise::lora_forward(const Matrix& x, const Matrix& var_x,
                                                   const Projection& p, const Dropout& d,
                                                   const Matrix& y, const std::string& name) {
  const Format &act = p_.activation, &ad = p_.adapter_compute, &acc = p_.accumulate;
  const double s = p.scaling, s2 = s * s;
  Matrix dropped_x;  // only with dropout: X itself otherwise (no copy of a large input)
  if (d.p != 0) dropped_x = dropped(x, d);
  const Matrix& xd = d.p == 0 ? x : dropped_x;
  const Matrix x2 = sq(x);
  // The adapter path's own roundings: X_d (its 1/(1-p) factor), X_d A^T and L.
  const Matrix var_xd_own = d.p > 0 ? rounding_variance(xd, ad) : Matrix();
  const Matrix xa = product(xd, Op::kPlain, p.lora_A, Op::kTransposed);
  Matrix var_xa_own =
      product_variance({xd, Op::kPlain, d.p > 0 ? &var_xd_own : nullptr, d.p == 0 ? &x2 : nullptr},
                       {p.lora_A, Op::kTransposed}, xa, 1.0, acc);
  add_by_rows(var_xa_own, rounding_variance(xa, ad));
  const Matrix lora = product(xa, Op::kPlain, p.lora_B, Op::kTransposed, s);
  Matrix var_lora = product_variance({xa, Op::kPlain, &var_xa_own}, {p.lora_B, Op::kTransposed},
                                     lora, unscale(s), acc, s2);
  add_by_rows(var_lora, rounding_variance(lora, ad) + rounding_variance(lora, act));

  // The base product X W (the reference's y less bias and adapter term), its weight's
  // rounding, accumulation and own rounding; x's own error through base and adapter together.
  Matrix base = by_rows(y - lora);
  if (p.bias.size() > 0) for_each_row(base.rows(), [&](int64_t t) { base.row(t) -= p.bias; });
  ProjectionForwardNoise out;
  out.y = weight_product_variance(x2, p.weight_t, Op::kPlain, base, act, acc, act);
  if (var_x.size() > 0) add_composite_variance(out.y, var_x, p, d, /*transposed=*/false);
  store(name + "/base_output", base);
  if (p.bias.size() > 0) {
    for_each_row(base.rows(), [&](int64_t t) { base.row(t) += p.bias; });
    add_by_rows(out.y, rounding_variance(base, act));
  }
  add_by_rows(out.y, var_lora + rounding_variance(y, act));
  // X_d A^T's variance for the backward's dB: each element sums independent errors of one row.
  out.xa = std::move(var_xa_own);
  if (var_x.size() > 0 && d.p > 0) {
    gemm(1.0, dropped_variance(var_x, d), Op::kPlain, sq(p.lora_A), Op::kTransposed, 1.0, out.xa);
  } else if (var_x.size() > 0) {
    gemm(1.0, var_x, Op::kPlain, sq(p.lora_A), Op::kTransposed, 1.0, out.xa);
  }
  store(name + "/adapter_output", lora);
  store(name + "/output", y);
  return out;
}

// Backward of one projection: dX = dY W + s ((dY B) A) * m / (1 - p) in the activation
// format (the adapter term from the adapter compute format), dA = s (dY B)^T X_d and
// dB = s dY^T (X_d A^T) in the adapter compute format, stored in the adapter format.
ProjectionGradsNoise RoundingNoise::lora_backward(const Matrix& x, const Matrix& var_x,
                                                  const Matrix& dy, const Matrix& var_dy,
                                                  const Projection& p, const Dropout& d,
                                                  const ProjectionForwardNoise& forward,
                                                  const ProjectionGrads& grads,
                                                  const std::string& name) {
  const Format &act = p_.activation, &ad = p_.adapter_compute, &acc = p_.accumulate;
  const double s = p.scaling, s2 = s * s;
  Matrix dropped_x;
  if (d.p != 0) dropped_x = dropped(x, d);
  const Matrix& xd = d.p == 0 ? x : dropped_x;
  // X_d's variance: x's (through the mask) and, with dropout, X_d's own rounding.
  Matrix var_xd_own;
  if (d.p > 0) {
    var_xd_own =
        plus(var_x.size() > 0 ? dropped_variance(var_x, d) : Matrix(), rounding_variance(xd, ad));
  }
  const Matrix* var_xd = d.p > 0 ? &var_xd_own : var_x.size() > 0 ? &var_x : nullptr;
  const Matrix xa = product(xd, Op::kPlain, p.lora_A, Op::kTransposed);
  const Matrix dy2 = sq(dy);  // every product of dY's below shares it

  const Matrix dyb = product(dy, p.lora_B);  // [M, r], unscaled
  Matrix var_dyb_own = product_variance({dy, Op::kPlain, nullptr, &dy2}, {p.lora_B}, dyb, 1.0, acc);
  add_by_rows(var_dyb_own, rounding_variance(dyb, ad));
  Matrix var_dyb = var_dyb_own;  // each element sums independent errors of one row of dY
  if (var_dy.size() > 0) gemm(1.0, var_dy, Op::kPlain, sq(p.lora_B), Op::kPlain, 1.0, var_dyb);

  ProjectionGradsNoise g;
  // The adapter's share of dX with its own roundings, then the base product dY W (the
  // reference's dX less that share); dY's own error through both together.
  const Matrix ba = product(dyb, p.lora_A);
  Matrix var_term = product_variance({dyb, Op::kPlain, &var_dyb_own}, {p.lora_A}, ba, 1.0, acc, s2);
  const Matrix term =
      d.p == 0 ? by_rows(s * ba) : by_rows((s * ba).cwiseProduct(d.mask) / (1.0 - d.p));
  if (d.p > 0) var_term = dropped_variance(var_term, d);
  add_by_rows(var_term, rounding_variance(term, ad) + rounding_variance(term, act));
  const Matrix dx_base = by_rows(grads.dx - term);
  g.dx = weight_product_variance(dy2, p.weight_t, Op::kTransposed, dx_base, act, acc, act);
  add_by_rows(g.dx, var_term + rounding_variance(grads.dx, act));
  if (var_dy.size() > 0) add_composite_variance(g.dx, var_dy, p, d, /*transposed=*/true);

  g.dA = product_variance({dyb, Op::kTransposed, &var_dyb}, {xd, Op::kPlain, var_xd}, grads.dA,
                          unscale(s), acc, s2);
  add_by_rows(g.dA, rounding_variance(grads.dA, ad) + rounding_variance(grads.dA, p_.adapter));
  g.dB = product_variance({dy, Op::kTransposed, var_dy.size() > 0 ? &var_dy : nullptr, &dy2},
                          {xa, Op::kPlain, &forward.xa}, grads.dB, unscale(s), acc, s2);
  add_by_rows(g.dB, rounding_variance(grads.dB, ad) + rounding_variance(grads.dB, p_.adapter));
  // Both shares are held in the activation format before they are added (as peft's autograd
  // does): either may overflow where their sum does not.
  store(name + "/input.grad", grads.dx);
  store(name + "/input.grad.base", dx_base);
  store(name + "/input.grad.adapter", term);
  return g;
}

namespace {

// SwiGLU's element values: silu(e), its first and second derivatives.
struct Silu {
  double value, d1, d2;
};
Silu silu(double e) {
  const double sg = sigmoid(e);
  return {e * sg, sg * (1.0 + e * (1.0 - sg)), sg * (1.0 - sg) * (2.0 + e * (1.0 - 2.0 * sg))};
}

}  // namespace

// Variance of h = silu(e) g (silu(e) possibly rounded first, h rounded) from those of e, g.
Matrix swiglu_variance(const Matrix& e, const Matrix& g, const Matrix& var_e, const Matrix& var_g,
                       const Format& act, const Format& acc, double inputs) {
  const double u2 = act.unit_roundoff * act.unit_roundoff, sub2 = act.subnormal * act.subnormal;
  // sigmoid(e) below the accumulation format's normal range may flush to zero: silu(e) then
  // errs by up to |e| times that range's bottom.
  const double ftz2 = acc.subnormal * acc.subnormal;
  Matrix var(e.rows(), e.cols());
  for_each_row(e.rows(), [&](int64_t t) {
    for (int64_t n = 0; n < e.cols(); ++n) {
      const Silu f = silu(e(t, n));
      const double gv = g(t, n), h = f.value * gv;
      const double ev = e(t, n);
      var(t, n) = inputs * (f.d1 * f.d1 * gv * gv * var_e(t, n) + f.value * f.value * var_g(t, n)) +
                  (u2 * f.value * f.value + sub2 + ev * ev * ftz2) * gv * gv + u2 * h * h + sub2;
    }
  });
  return var;
}

SwigluGradsNoise swiglu_backward_variance(const Matrix& e, const Matrix& g, const Matrix& dh,
                                          const Matrix& var_e, const Matrix& var_g,
                                          const Matrix& var_dh, const Format& act,
                                          const Format& acc, double inputs) {
  const double u2 = act.unit_roundoff * act.unit_roundoff, sub2 = act.subnormal * act.subnormal;
  const double ftz2 = acc.subnormal * acc.subnormal;  // a flushed sigmoid, as in the forward
  const int64_t rows = e.rows(), cols = e.cols();
  SwigluGradsNoise out{Matrix(rows, cols), Matrix(rows, cols), Matrix(rows, cols),
                       Matrix(rows, cols)};
  for_each_row(rows, [&](int64_t t) {
    for (int64_t c = 0; c < cols; ++c) {
      const Silu f = silu(e(t, c));
      const double gv = g(t, c), d = dh(t, c);
      const double dg = d * f.value, de = d * gv * f.d1;
      out.dg(t, c) = dg;
      out.de(t, c) = de;
      const double ev = e(t, c);
      out.var_dg(t, c) =
          f.value * f.value * var_dh(t, c) + inputs * d * d * f.d1 * f.d1 * var_e(t, c) +
          d * d * (u2 * f.value * f.value + sub2 + ev * ev * ftz2) + u2 * dg * dg + sub2;
      out.var_de(t, c) =
          gv * gv * f.d1 * f.d1 * var_dh(t, c) +
          inputs *
              (d * d * f.d1 * f.d1 * var_g(t, c) + d * d * gv * gv * f.d2 * f.d2 * var_e(t, c)) +
          d * d * gv * gv * (u2 * f.d1 * f.d1 + sub2 + (1 + ev * ev) * ftz2) + u2 * de * de + sub2;
    }
  });
  return out;
}

MlpNoise RoundingNoise::mlp(const MlpTape& tape, const Matrix& x, const Matrix& dy,
                            const Projection& gate, const Projection& up, const Projection& down,
                            const Dropout& dx, const Dropout& dh, const Matrix& y,
                            const MlpGrads& grads) {
  const Format& act = p_.activation;
  const Matrix none;
  const auto fg = lora_forward(x, none, gate, dx, tape.e, "gate_proj");
  const auto fu = lora_forward(x, none, up, dx, tape.g, "up_proj");
  const Matrix h = swiglu(tape.e, tape.g);
  const Matrix var_h = swiglu_variance(tape.e, tape.g, fg.y, fu.y, act, p_.accumulate, 1.0);
  store("mlp/h", h);
  const auto fd = lora_forward(h, var_h, down, dh, y, "down_proj");
  MlpNoise n;
  n.y = fd.y;
  n.down = lora_backward(h, var_h, dy, none, down, dh, fd, grads.down, "down_proj");
  const auto sg = swiglu_backward_variance(tape.e, tape.g, grads.down.dx, fg.y, fu.y, n.down.dx,
                                           act, p_.accumulate, 1.0);
  store("mlp/dg", sg.dg);
  store("mlp/de", sg.de);
  n.up = lora_backward(x, none, sg.dg, sg.var_dg, up, dx, fu, grads.up, "up_proj");
  n.gate = lora_backward(x, none, sg.de, sg.var_de, gate, dx, fg, grads.gate, "gate_proj");
  n.dx = by_rows(n.up.dx + n.gate.dx + rounding_variance(grads.dx, act));
  return n;
}

// The activation path of one layer as the tape holds it, with the variance of each value.
struct RoundingNoise::LayerForward {
  Matrix n1, q, k, v, qr, kr, attn, h, n2, e, g, hm, out;  // variances
  ProjectionForwardNoise fq, fk, fv, fo, fgate, fup, fdown;
};

// RMSNorm y = w x r, with r = (mean(x^2) + eps)^(-1/2) from fp32 statistics and x r rounded
// to the activation format before the weight: variance of y, and the statistics.
Matrix rmsnorm_variance(const Matrix& x, const Matrix& var_x, const RmsNorm& norm,
                        const Format& act, const Format& acc) {
  const int64_t rows = x.rows(), dim = x.cols();
  const double D = static_cast<double>(dim);
  const double ua2 = acc.unit_roundoff * acc.unit_roundoff;
  const double u2 = act.unit_roundoff * act.unit_roundoff, sub2 = act.subnormal * act.subnormal;
  Matrix var(rows, dim);
  for_each_row(rows, [&](int64_t t) {
    const auto row = x.row(t);
    const double ms = row.squaredNorm() / D;
    const double r = 1.0 / std::sqrt(ms + norm.eps);
    const double sum_t2 = row.array().square().square().sum() / (D * D);
    double var_ms = accumulation(acc, dim) * (sum_t2 + ms * ms);
    double sx = 0;  // sum_j x_j^2 var_j
    if (var_x.size() > 0) {
      sx = (row.array().square() * var_x.row(t).array()).sum();
      var_ms += 4.0 / (D * D) * sx;
    }
    for (int64_t i = 0; i < dim; ++i) {
      const double xi = row(i), n = xi * r, w = norm.weight(i);
      // dn_i/dx_i = r (1 - a_i) directly; through the mean the other inputs move it by
      // -x_i r^3 / 2 dms, whose variance var_ms already holds.
      const double a = xi * xi * r * r / D;
      const double vi = var_x.size() > 0 ? var_x(t, i) : 0.0;
      double vn = r * r * ((1 - a) * (1 - a) - a * a) * vi;
      vn += 0.25 * xi * xi * r * r * r * r * r * r * var_ms;
      vn = std::max(vn, 0.0) + ua2 * n * n + u2 * n * n + sub2;
      var(t, i) = w * w * vn + u2 * (w * n) * (w * n) + sub2;
    }
  });
  return var;
}

// RMSNorm's backward dx = r gw - x r^3 <gw, x> / D with gw = dy w (rounded to the
// activation format), from fp32 statistics: variance of dx given those of x and dy.
Matrix rmsnorm_backward_variance(const Matrix& x, const Matrix& var_x, const Matrix& dy,
                                 const Matrix& var_dy, const RmsNorm& norm, const Format& act,
                                 const Format& acc) {
  const int64_t rows = x.rows(), dim = x.cols();
  const double D = static_cast<double>(dim);
  const double ua2 = acc.unit_roundoff * acc.unit_roundoff;
  const double u2 = act.unit_roundoff * act.unit_roundoff, sub2 = act.subnormal * act.subnormal;
  Matrix var(rows, dim);
  for_each_row(rows, [&](int64_t t) {
    const auto row = x.row(t);
    const double ms = row.squaredNorm() / D, r = 1.0 / std::sqrt(ms + norm.eps);
    const double r3 = r * r * r;
    const Eigen::RowVectorXd gw = dy.row(t).cwiseProduct(norm.weight);
    Eigen::RowVectorXd var_gw = (u2 * gw.array().square() + sub2).matrix();
    if (var_dy.size() > 0) var_gw += var_dy.row(t).cwiseProduct(norm.weight.cwiseAbs2());
    const double c = gw.dot(row);
    const double var_c = accumulation(acc, dim) * ((gw.cwiseProduct(row)).squaredNorm() + c * c);
    const double var_ms =
        accumulation(acc, dim) * (row.array().square().square().sum() / (D * D) + ms * ms);
    const double sxg = (row.array().square() * var_gw.array()).sum();
    // x's own error: dx_i moves by k1_i <x, dx> + k2 dx_i + k3_i <gw, dx> (through r, through
    // x_i itself, through c); the three share the same errors, so their covariances count.
    double sxx = 0, sxgx = 0, sgg = 0;  // sum_j var_j times x_j^2, x_j gw_j, gw_j^2
    if (var_x.size() > 0) {
      const auto vx = var_x.row(t).array();
      sxx = (row.array().square() * vx).sum();
      sxgx = (row.array() * gw.array() * vx).sum();
      sgg = (gw.array().square() * vx).sum();
    }
    const double k2 = -r3 * c / D;
    for (int64_t i = 0; i < dim; ++i) {
      const double xi = row(i), a = xi * xi * r * r / D;
      const double dx = r * gw(i) - xi * r3 * c / D;
      // Through gw: the same Jacobian shape as the forward.
      double v = r * r *
                 ((1 - a) * (1 - a) * var_gw(i) +
                  (xi * r * r / D) * (xi * r * r / D) * (sxg - xi * xi * var_gw(i)));
      v = std::max(v, 0.0);
      // Through c's accumulation and the mean's.
      v += (xi * r3 / D) * (xi * r3 / D) * var_c;
      const double dr = -0.5 * r3;  // dr / dms
      const double through_ms = gw(i) * dr - 3.0 * xi * r * r * dr * c / D;
      v += through_ms * through_ms * var_ms;
      if (var_x.size() > 0) {
        const double k1 = -gw(i) * r3 / D + 3.0 * xi * r3 * r * r * c / (D * D);
        const double k3 = -xi * r3 / D;
        const double vi = var_x(t, i);
        v += std::max(0.0, k1 * k1 * sxx + 2 * k1 * k3 * sxgx + k3 * k3 * sgg +
                               2 * k2 * (k1 * xi + k3 * gw(i)) * vi + k2 * k2 * vi);
      }
      var(t, i) = v + ua2 * dx * dx + u2 * dx * dx + sub2;
    }
  });
  return var;
}

// Rotary embedding with cos/sin tables computed in the accumulation format (angle = position
// x frequency, rounded twice) and rounded to the activation format; `sign` -1 is the
// transposed rotation of the backward. Variance of the result given that of x.
Matrix rope_variance(const Matrix& x, const Matrix& var_x, const AttentionShape& s, int64_t heads,
                     double sign, const Format& act, const Format& acc) {
  const int64_t d = s.head_dim, half = d / 2;
  const double u2 = act.unit_roundoff * act.unit_roundoff, sub2 = act.subnormal * act.subnormal;
  const double ua = acc.unit_roundoff;
  const double angle_roundings = s.rope_scaling.llama3 ? 6.0 : 2.0;
  Matrix var(x.rows(), x.cols());
  for_each_row(x.rows(), [&](int64_t row) {
    const double position = static_cast<double>(row % s.seq + s.position_offset);
    for (int64_t i = 0; i < half; ++i) {
      const double angle = position * rope_frequency(s, i);
      const double c = std::cos(angle), sn = std::sin(angle);
      // The table's error: the angle's (2 roundings of |angle|, and 4 more where Llama 3's
      // scaling computes the frequency: the wavelength, its ratio, the smoothing factor and
      // the blend), cos/sin's own, then the rounding of the table entry into the activation
      // format.
      const double dangle2 = angle_roundings * angle_roundings * ua * ua * angle * angle;
      const double var_c = sn * sn * dangle2 + ua * ua * c * c + u2 * c * c + sub2;
      const double var_s = c * c * dangle2 + ua * ua * sn * sn + u2 * sn * sn + sub2;
      for (int64_t h = 0; h < heads; ++h) {
        const int64_t ia = h * d + i, ib = ia + half;
        const double a = x(row, ia), b = x(row, ib);
        const double va = var_x.size() ? var_x(row, ia) : 0.0;
        const double vb = var_x.size() ? var_x(row, ib) : 0.0;
        const double ya = a * c - sign * b * sn, yb = b * c + sign * a * sn;
        const double products = u2 * (a * a * c * c + b * b * sn * sn) + 2 * sub2;
        var(row, ia) = c * c * va + sn * sn * vb + a * a * var_c + b * b * var_s + products +
                       u2 * ya * ya + sub2;
        var(row, ib) = c * c * vb + sn * sn * va + b * b * var_c + a * a * var_s + products +
                       u2 * yb * yb + sub2;
      }
    }
  });
  return var;
}

namespace {

// Causal softmax probabilities and their variance for rows [row0, row0 + m) of one (batch,
// head) block, given the scores' variance; `scores` holds those rows against keys [0, c), and
// row i attends keys j <= i: var_P_ij = P_ij^2 ((1 - 2 P_ij) var_S_ij + sum_k P_ik^2 var_S_ik),
// plus the normalising sum's accumulation and the rounding of P into the activation format.
// Entries of masked keys stay exactly zero, with no variance.
void softmax_rows_variance(const Matrix& scores, const Matrix& var_s, int64_t row0,
                           const Format& act, const Format& acc, Matrix& p, Matrix& var_p) {
  const int64_t m = scores.rows();
  const double u2 = act.unit_roundoff * act.unit_roundoff, sub2 = act.subnormal * act.subnormal;
  const double ua2 = acc.unit_roundoff * acc.unit_roundoff;
  p = Matrix::Zero(m, scores.cols());
  var_p = Matrix::Zero(m, scores.cols());
  for (int64_t r = 0; r < m; ++r) {
    const int64_t i = row0 + r;
    double mx = scores(r, 0);
    for (int64_t j = 1; j <= i; ++j) mx = std::max(mx, scores(r, j));
    double sum = 0;
    for (int64_t j = 0; j <= i; ++j) sum += (p(r, j) = std::exp(scores(r, j) - mx));
    double spv = 0;
    for (int64_t j = 0; j <= i; ++j) {
      p(r, j) /= sum;
      spv += p(r, j) * p(r, j) * var_s(r, j);
    }
    // The normalising sum of i + 1 positive terms (relative variance u^2 (i + 1)), the
    // exponential and the division.
    const double normalise = ua2 * static_cast<double>(i + 3);
    for (int64_t j = 0; j <= i; ++j) {
      const double pj = p(r, j);
      const double v = pj * pj * ((1 - 2 * pj) * var_s(r, j) + spv);
      var_p(r, j) = std::max(v, 0.0) + normalise * pj * pj + u2 * pj * pj + sub2;
    }
  }
}

}  // namespace

void softmax_variance(const Matrix& scores, const Matrix& var_s, const Format& act,
                      const Format& acc, Matrix& p, Matrix& var_p) {
  softmax_rows_variance(scores, var_s, 0, act, acc, p, var_p);
}

namespace {

// sum_j A_ij (X_jd - Y_id)^2 for A [m, c], X [c, d], Y [m, d]: the spread of X's rows about
// Y_i weighted by A's row i, expanded into products: (A X^2) - 2 Y o (A X) + Y^2 o rowsum(A).
// `ax`: A X where the caller holds it (for Y = A X itself, e.g. O = P V), not computed again.
Matrix centred_spread(const Matrix& a, const Matrix& x, const Matrix& y,
                      const Matrix* ax = nullptr) {
  Matrix out = product(a, sq(x));
  out -= 2 * y.cwiseProduct(ax ? *ax : product(a, x));
  out += (y.cwiseAbs2().array().colwise() * a.rowwise().sum().array()).matrix();
  return out.cwiseMax(0.0);
}

// One (batch, head) block's inputs [seq, head_dim]; a variance may be empty (exact).
struct Head {
  Matrix q, k, v, vq, vk, vv;
  double scale = 0;
};

Head head_of(const Matrix& q, const Matrix& k, const Matrix& v, const Matrix& var_q,
             const Matrix& var_k, const Matrix& var_v, const AttentionShape& s, int64_t bh) {
  const int64_t d = s.head_dim, b = bh / s.heads, h = bh % s.heads;
  const int64_t kv = h / (s.heads / s.kv_heads);
  const auto blk = [&](const Matrix& m, int64_t col) {
    return m.size() ? Matrix(m.block(b * s.seq, col * d, s.seq, d)) : Matrix();
  };
  return {blk(q, h),      blk(k, kv),     blk(v, kv),        blk(var_q, h),
          blk(var_k, kv), blk(var_v, kv), attention_scale(s)};
}

// Rows [i0, i1) of a head's causal attention. Every key from i1 on is masked for all of them,
// so the tile holds keys [0, i1) only: the masked keys' probabilities and everything derived
// from them are exact zeros, which the products need not visit (about half of a block's work).
struct AttentionTile {
  int64_t i0 = 0, i1 = 0;
  Matrix q, vq;                // the tile's rows [i1 - i0, d]
  Matrix k, v, vk, vv;         // keys [0, i1) [i1, d]
  Matrix scores, p, v_scores;  // S = Q K^T / sqrt(d), P = softmax(S) [i1 - i0, i1]
  Matrix o;                    // O = P V [i1 - i0, d]
  double scale = 0;
};

AttentionTile attention_tile(const Head& h, int64_t i0, int64_t i1, const Format& act,
                             const Format& acc) {
  AttentionTile t;
  const int64_t m = i1 - i0;
  const auto rows = [&](const Matrix& x) { return x.size() ? Matrix(x.middleRows(i0, m)) : x; };
  const auto keys = [&](const Matrix& x) { return x.size() ? Matrix(x.topRows(i1)) : x; };
  t.i0 = i0, t.i1 = i1, t.scale = h.scale;
  t.q = rows(h.q), t.vq = rows(h.vq);
  t.k = keys(h.k), t.v = keys(h.v), t.vk = keys(h.vk), t.vv = keys(h.vv);
  t.scores = product(t.q, Op::kPlain, t.k, Op::kTransposed, h.scale);
  // Per (i, j) independent errors of a score: K_j's error seen through Q_i, the product's
  // accumulation, its rounding into the activation format and exp's own relative error.
  t.v_scores = product_variance({t.q}, {t.k, Op::kTransposed, t.vk.size() ? &t.vk : nullptr},
                                t.scores, 1.0 / h.scale, acc, h.scale * h.scale);
  t.v_scores += rounding_variance(t.scores, act);
  t.v_scores.array() += acc.unit_roundoff * acc.unit_roundoff;
  t.p = Matrix::Zero(m, i1);
  for (int64_t r = 0; r < m; ++r) {
    const int64_t i = i0 + r;
    double mx = t.scores(r, 0);
    for (int64_t j = 1; j <= i; ++j) mx = std::max(mx, t.scores(r, j));
    double sum = 0;
    for (int64_t j = 0; j <= i; ++j) sum += (t.p(r, j) = std::exp(t.scores(r, j) - mx));
    t.p.row(r) /= sum;
  }
  t.o = product(t.p, t.v);
  return t;
}

// Keeps in `worst` the larger of it and a tile's largest unmasked score error (the first in
// key-major order on ties), from the scores' variances. A NaN variance is the largest: the
// model has failed there.
void note_score_error(const Matrix& v_scores, const AttentionTile& a, int64_t batch, int64_t head,
                      ScoreError& worst) {
  const int64_t m = a.i1 - a.i0;
  double largest = worst.sigma * worst.sigma;
  for (int64_t j = 0; j < a.i1 && !std::isnan(largest); ++j) {
    for (int64_t r = std::max<int64_t>(0, j - a.i0); r < m; ++r) {
      const double v = v_scores(r, j);
      if (v > largest || std::isnan(v)) {
        largest = v;
        worst = {std::sqrt(v), a.scores(r, j), batch, head, a.i0 + r, j};
        if (std::isnan(v)) break;
      }
    }
  }
}

// Over the (batch, head) blocks, in block order: the first block's on ties, a NaN first of all.
ScoreError largest_score_error(const std::vector<ScoreError>& blocks) {
  ScoreError out;
  for (const auto& w : blocks) {
    if (std::isnan(w.sigma)) return w;
    if (w.sigma > out.sigma) out = w;
  }
  return out;
}

// Kv_ie = sum_j P_ij (K_je - Kbar_ie)^2, the spread of the keys a query row attends to, about
// their mean Kbar = P K.
Matrix key_spread(const AttentionTile& t, const Matrix& kbar) {
  return centred_spread(t.p, t.k, kbar, &kbar);
}

// Row j of the result: sum_{i >= j} x_i (row n: zero), for the masked keys' share of a sum.
Matrix suffix_sums(const Matrix& x) {
  Matrix out = Matrix::Zero(x.rows() + 1, x.cols());
  for (int64_t j = x.rows() - 1; j >= 0; --j) out.row(j) = out.row(j + 1) + x.row(j);
  return out;
}

}  // namespace

Matrix attention_forward_variance(const Matrix& q, const Matrix& k, const Matrix& v,
                                  const Matrix& var_q, const Matrix& var_k, const Matrix& var_v,
                                  const AttentionShape& s, const Format& act, const Format& acc,
                                  double* max_score, int64_t tile_rows, ScoreError* scores) {
  const int64_t d = s.head_dim, n = s.seq;
  const double ua2 = acc.unit_roundoff * acc.unit_roundoff, sub2 = act.subnormal * act.subnormal;
  Matrix var = Matrix::Zero(q.rows(), q.cols());
  std::vector<double> score_max(s.batch * s.heads, 0.0);
  std::vector<ScoreError> worst(scores ? s.batch * s.heads : 0);
  for_each_row(s.batch * s.heads, [&](int64_t bh) {
    const int64_t b = bh / s.heads, hd = bh % s.heads;
    const Head h = head_of(q, k, v, var_q, var_k, var_v, s, bh);
    const Matrix v2 = sq(h.v);
    const Matrix k2 = scores && h.vq.size() > 0 ? sq(h.k) : Matrix();
    const Eigen::RowVectorXd v2_sum = v2.colwise().sum();
    for (int64_t i0 = 0; i0 < n; i0 += tile_rows) {
      const int64_t i1 = std::min(n, i0 + tile_rows), m = i1 - i0;
      const auto a = attention_tile(h, i0, i1, act, acc);
      // The largest score held, masked ones included (an implementation may compute them).
      score_max[bh] = std::max(score_max[bh], a.scores.cwiseAbs().maxCoeff());
      if (i1 < n) {
        const Matrix later =
            product(a.q, Op::kPlain, Matrix(h.k.bottomRows(n - i1)), Op::kTransposed, h.scale);
        score_max[bh] = std::max(score_max[bh], later.cwiseAbs().maxCoeff());
      }
      if (scores) {  // Q_i's error reaches the score as in the backward's v_scores
        Matrix v_scores = a.v_scores;
        if (a.vq.size() > 0) {
          v_scores +=
              product(a.vq, Op::kPlain, Matrix(k2.topRows(i1)), Op::kTransposed, h.scale * h.scale);
        }
        note_score_error(v_scores, a, b, hd, worst[bh]);
      }
      const Matrix p2 = a.p.cwiseAbs2(), v2t = v2.topRows(i1);
      // Errors independent per score (i, j): O_i moves by P_ij dS_ij (V_j - O_i).
      Matrix v_o = centred_spread(p2.cwiseProduct(a.v_scores), a.v, a.o);
      // Q_i's error reaches every score of row i: bounded by Cauchy-Schwarz over the keys,
      // var <= scale^2 (sum_j P_ij (V_jd - O_id)^2) (sum_e var_Q_ie Kv_ie).
      if (a.vq.size() > 0) {
        const Eigen::VectorXd t =
            (a.vq.cwiseProduct(key_spread(a, product(a.p, a.k)))).rowwise().sum();
        v_o += (h.scale * h.scale) *
               (centred_spread(a.p, a.v, a.o, &a.o).array().colwise() * t.array()).matrix();
      }
      // In one product with P o P: V_j's error through P_ij; P rounded into the activation
      // format before the product (u^2 P^2; the format's subnormal term, which a masked key's
      // exact zero counts too as every stored value does, is added from V^2's column sums);
      // O's accumulation (accumulation(acc, n) (P^2 V^2 + O^2)). Then the normalising sum of i + 1
      // positive terms (a relative error shared by the row) and O's rounding.
      const double acc_n = accumulation(acc, n);
      Matrix through_p2 = (act.unit_roundoff * act.unit_roundoff + acc_n) * v2t;
      if (a.vv.size() > 0) through_p2 += a.vv;
      v_o += product(p2, through_p2);
      v_o.rowwise() += sub2 * v2_sum;
      Eigen::VectorXd row_sum(m);
      for (int64_t r = 0; r < m; ++r) row_sum(r) = ua2 * static_cast<double>(i0 + r + 2);
      v_o += (a.o.cwiseAbs2().array().colwise() * row_sum.array()).matrix();
      v_o += acc_n * a.o.cwiseAbs2();
      var.block(b * n + i0, hd * d, m, d) = v_o + rounding_variance(a.o, act);
    }
  });
  if (max_score) *max_score = *std::max_element(score_max.begin(), score_max.end());
  if (scores) *scores = largest_score_error(worst);
  return var;
}

namespace {

// One (batch, head) block's inputs to the backward beyond its Head: dO and its variance, the
// squares the products of variances take, and the format constants.
struct HeadBackward {
  const Head& h;
  Matrix doh, vdo, k2, q2, do2, v2, k2_after;
  int64_t b, hd;
  double scale, s2, sub2, acc_n;
};

// One tile's softmax backward, dS = P (dP - c), and the variances of its parts: e (dP's
// errors, independent per (i, j)) with dS's share of it, and the rest of dS's, element by
// element.
struct TileGrad {
  Matrix doh_t, vdo_t, do2_t, q2_t, k2t;  // the tile's rows (keys [0, i1) for k2t)
  Matrix p2, dp, ds, ds2, kbar, centred, e, var_ds_e, var_ds_rest, var_p;
};

TileGrad tile_grad(const HeadBackward& hb, const AttentionTile& a, const Format& act,
                   const Format& acc, ScoreError& worst) {
  const int64_t i0 = a.i0, i1 = a.i1, m = i1 - i0;
  const auto rows = [&](const Matrix& x) {
    return x.size() ? Matrix(x.middleRows(i0, m)) : Matrix();
  };
  TileGrad t;
  t.doh_t = rows(hb.doh), t.vdo_t = rows(hb.vdo), t.do2_t = rows(hb.do2), t.q2_t = rows(hb.q2);
  t.k2t = hb.k2.topRows(i1);
  const Matrix& p = a.p;
  t.p2 = p.cwiseAbs2();
  t.dp = product(t.doh_t, Op::kPlain, a.v, Op::kTransposed);
  const Eigen::VectorXd c = t.dp.cwiseProduct(p).rowwise().sum();
  t.ds = p.cwiseProduct(t.dp.colwise() - c);
  t.kbar = product(p, a.k);
  // Errors of dP independent per (i, j): its accumulation and rounding, and V_j's error
  // seen through dO_i.
  t.e = product_variance({t.doh_t, Op::kPlain, nullptr, &t.do2_t},
                         {a.v, Op::kTransposed, a.vv.size() > 0 ? &a.vv : nullptr}, t.dp, 1.0, acc);
  add_by_rows(t.e, rounding_variance(t.dp, act));
  // dS's variance from e, softmax-shaped: P_ij^2 ((1 - 2 P_ij) e_ij + sum_k P_ik^2 e_ik).
  const Eigen::VectorXd pe = t.p2.cwiseProduct(t.e).rowwise().sum();
  t.var_ds_e =
      t.p2.cwiseProduct((((1.0 - 2.0 * p.array()) * t.e.array()).colwise() + pe.array()).matrix())
          .cwiseMax(0.0);
  // The rest of dS's variance, element by element (the model's approximation here,
  // docs/verification.md): P's error (from the scores' and Q's) through (dP - c), c's
  // accumulation (shared by the row) and dS's own rounding.
  Matrix v_scores = a.v_scores;
  if (a.vq.size() > 0) v_scores += product(a.vq, Op::kPlain, t.k2t, Op::kTransposed, hb.s2);
  Matrix sp;
  softmax_rows_variance(a.scores, v_scores, i0, act, acc, sp, t.var_p);
  note_score_error(v_scores, a, hb.b, hb.hd, worst);
  t.centred = t.dp.colwise() - c;
  // c_i = sum_j P_ij dP_ij carries P's error (dP's enters through e above) and its own
  // accumulation: with a saturated softmax (dP - c ~ 0) this is dS's main error.
  const Eigen::VectorXd var_c =
      t.dp.cwiseAbs2().cwiseProduct(t.var_p).rowwise().sum() +
      hb.acc_n * (t.dp.cwiseProduct(p).cwiseAbs2().rowwise().sum() + c.cwiseAbs2());
  t.var_ds_rest = t.centred.cwiseAbs2().cwiseProduct(t.var_p);
  t.var_ds_rest += (t.p2.array().colwise() * var_c.array()).matrix();
  // dS's rounding (a masked key's exact zero counts the subnormal term, as every stored
  // value does: for the keys past the tile, added from their sums below).
  t.var_ds_rest += rounding_variance(t.ds, act);
  t.ds2 = sq(t.ds);
  return t;
}

// dQ = scale dS K's variance for the tile's rows: e exactly, through the keys centred on the
// row's mean key; the rest of dS element by element; K's own error; dO's error (shared by row
// i) bounded by Cauchy-Schwarz: scale^2 Kv_ie sum_d var_dO_id (sum_j P_ij (V_jd - O_id)^2).
Matrix tile_dq_variance(const HeadBackward& hb, const AttentionTile& a, const TileGrad& t,
                        const Matrix& dqh, int64_t n) {
  const double s2 = hb.s2, acc_n = hb.acc_n;
  // (The rest of dS and dQ's accumulation, accumulation(acc, n) dS^2, share one product with
  // K^2.)
  Matrix v_dq = s2 * centred_spread(t.p2.cwiseProduct(t.e), a.k, t.kbar);
  v_dq += product(by_rows(t.var_ds_rest + acc_n * t.ds2), Op::kPlain, t.k2t, Op::kPlain, s2);
  if (a.i1 < n) v_dq.rowwise() += (s2 * hb.sub2) * hb.k2_after.row(a.i1);
  if (a.vk.size() > 0) v_dq += product(t.ds2, Op::kPlain, a.vk, Op::kPlain, s2);
  if (t.vdo_t.size() > 0) {
    const Eigen::VectorXd w =
        (t.vdo_t.cwiseProduct(centred_spread(a.p, a.v, a.o, &a.o))).rowwise().sum();
    v_dq += s2 * (key_spread(a, t.kbar).array().colwise() * w.array()).matrix();
  }
  v_dq += (s2 * acc_n) * (dqh / hb.scale).cwiseAbs2();
  return v_dq;
}

// dK = scale dS^T Q's variance from the tile: dS's variance element by element (rows i
// independent); dO's error exactly, as sum_i P_ij^2 Q_ie^2 sum_d (V_jd - O_id)^2 var_dO_id;
// dK's accumulation, accumulation(acc, n) dS^2 Q^2 (these three in one product with Q^2);
// Q's own error.
void add_tile_dk_variance(const HeadBackward& hb, const AttentionTile& a, const TileGrad& t,
                          int64_t n, Matrix& v_dk) {
  const int64_t i1 = a.i1;
  const double s2 = hb.s2;
  Matrix through_q2 = by_rows(t.var_ds_e + t.var_ds_rest + hb.acc_n * t.ds2);
  if (i1 < n) v_dk.bottomRows(n - i1).rowwise() += (s2 * hb.sub2) * t.q2_t.colwise().sum();
  if (t.vdo_t.size() > 0) {
    // G_ij = sum_d (V_jd - O_id)^2 var_dO_id
    Matrix g = product(t.vdo_t, Op::kPlain, Matrix(hb.v2.topRows(i1)), Op::kTransposed);
    g -= product(t.vdo_t.cwiseProduct(a.o), Op::kPlain, a.v, Op::kTransposed, 2.0);
    g.colwise() += t.vdo_t.cwiseProduct(a.o.cwiseAbs2()).rowwise().sum();
    through_q2 += t.p2.cwiseProduct(g.cwiseMax(0.0));
  }
  v_dk.topRows(i1) += product(through_q2, Op::kTransposed, t.q2_t, Op::kPlain, s2);
  if (a.vq.size() > 0) v_dk.topRows(i1) += product(t.ds2, Op::kTransposed, a.vq, Op::kPlain, s2);
}

// dV = P^T dO's variance from the tile: P's error element by element and the accumulation (one
// product with dO^2), dO's error exactly.
void add_tile_dv_variance(const HeadBackward& hb, const TileGrad& t, int64_t i1, Matrix& v_dv) {
  v_dv.topRows(i1) +=
      product(by_rows(t.var_p + hb.acc_n * t.p2), Op::kTransposed, t.do2_t, Op::kPlain);
  if (t.vdo_t.size() > 0) v_dv.topRows(i1) += product(t.p2, Op::kTransposed, t.vdo_t, Op::kPlain);
}

}  // namespace

AttentionGradsNoise attention_backward_variance(const Matrix& q, const Matrix& k, const Matrix& v,
                                                const Matrix& dout, const Matrix& var_q,
                                                const Matrix& var_k, const Matrix& var_v,
                                                const Matrix& var_dout, const AttentionShape& s,
                                                const Format& act, const Format& acc,
                                                int64_t tile_rows) {
  // With dP = dO V^T, c_i = sum_j P_ij dP_ij, dS = P (dP - c): dQ = scale dS K,
  // dK = scale dS^T Q, dV = P^T dO. An error e_ij of dP independent per (i, j) moves dS_ij by
  // P_ij (e_ij - sum_k P_ik e_ik): it reaches dQ_i as scale sum_j P_ij e_ij (K_j - Kbar_i)
  // and dK_j as scale sum_i P_ij (e_ij - sum_k P_ik e_ik) Q_i.
  const int64_t d = s.head_dim, n = s.seq, group = s.heads / s.kv_heads;
  const int64_t blocks = s.batch * s.heads;
  const double sub2 = act.subnormal * act.subnormal, acc_n = accumulation(acc, n);
  AttentionGradsNoise out;
  out.dq_value.resize(q.rows(), q.cols());
  out.dq.resize(q.rows(), q.cols());
  std::vector<Matrix> dk_parts(blocks), dv_parts(blocks), var_dk_parts(blocks),
      var_dv_parts(blocks);
  std::vector<ScoreError> worst(blocks);
  for_each_row(blocks, [&](int64_t bh) {
    const int64_t b = bh / s.heads, hd = bh % s.heads;
    const Head h = head_of(q, k, v, var_q, var_k, var_v, s, bh);
    const auto blk = [&](const Matrix& m) {
      return m.size() ? Matrix(m.block(b * n, hd * d, n, d)) : Matrix();
    };
    HeadBackward hb{h, blk(dout), blk(var_dout), sq(h.k),           sq(h.q), {},   {}, {},
                    b, hd,        h.scale,       h.scale * h.scale, sub2,    acc_n};
    hb.do2 = sq(hb.doh);
    hb.v2 = hb.vdo.size() > 0 ? sq(h.v) : Matrix();
    hb.k2_after = suffix_sums(hb.k2);
    Matrix dk = Matrix::Zero(n, d), v_dk = Matrix::Zero(n, d);
    Matrix dv = Matrix::Zero(n, d), v_dv = Matrix::Zero(n, d);
    for (int64_t i0 = 0; i0 < n; i0 += tile_rows) {
      const int64_t i1 = std::min(n, i0 + tile_rows), m = i1 - i0;
      const auto a = attention_tile(h, i0, i1, act, acc);
      const TileGrad t = tile_grad(hb, a, act, acc, worst[bh]);
      const Matrix dqh = product(t.ds, Op::kPlain, a.k, Op::kPlain, hb.scale);
      out.dq_value.block(b * n + i0, hd * d, m, d) = dqh;
      out.dq.block(b * n + i0, hd * d, m, d) =
          tile_dq_variance(hb, a, t, dqh, n) + rounding_variance(dqh, act);
      dk.topRows(i1) += product(t.ds, Op::kTransposed, a.q, Op::kPlain, hb.scale);
      add_tile_dk_variance(hb, a, t, n, v_dk);
      dv.topRows(i1) += product(a.p, Op::kTransposed, t.doh_t, Op::kPlain);
      add_tile_dv_variance(hb, t, i1, v_dv);
    }
    v_dk += hb.s2 * acc_n * (dk / hb.scale).cwiseAbs2();
    v_dv += acc_n * dv.cwiseAbs2();
    var_dk_parts[bh] = v_dk + rounding_variance(dk, act);
    var_dv_parts[bh] = v_dv + rounding_variance(dv, act);
    dk_parts[bh] = std::move(dk);
    dv_parts[bh] = std::move(dv);
  });
  out.scores = largest_score_error(worst);
  // The heads of a group add their shares of dK and dV, each partial sum rounded.
  out.dk_value = Matrix::Zero(k.rows(), k.cols());
  out.dv_value = out.dk_value;
  out.dk = out.dk_value;
  out.dv = out.dk_value;
  for_each_row(s.batch * s.kv_heads, [&](int64_t bkv) {
    const int64_t b = bkv / s.kv_heads, kv = bkv % s.kv_heads;
    auto dk_sum = out.dk_value.block(b * s.seq, kv * d, s.seq, d);
    auto dv_sum = out.dv_value.block(b * s.seq, kv * d, s.seq, d);
    for (int64_t h = kv * group; h < (kv + 1) * group; ++h) {
      const int64_t bh = b * s.heads + h;
      dk_sum += dk_parts[bh];
      dv_sum += dv_parts[bh];
      out.dk.block(b * s.seq, kv * d, s.seq, d) +=
          var_dk_parts[bh] + rounding_variance(dk_sum, act);
      out.dv.block(b * s.seq, kv * d, s.seq, d) +=
          var_dv_parts[bh] + rounding_variance(dv_sum, act);
    }
  });
  return out;
}

namespace {

// m y for a residual branch y of variance var_y (empty: exact): Hugging Face's Granite rounds
// the product to the activation format; m = 1 is no product at all.
Matrix residual_branch_variance(const Matrix& y, const Matrix& var_y, double m, const Format& act) {
  if (m == 1.0) return var_y;
  const Matrix scaled = m * y;
  return var_y.size() ? Matrix(m * m * var_y + rounding_variance(scaled, act))
                      : rounding_variance(scaled, act);
}

}  // namespace

RoundingNoise::LayerForward RoundingNoise::layer_forward(const LayerTape& t, const Matrix& x,
                                                         const Matrix& var_x, const Layer& l,
                                                         const AttentionShape& s,
                                                         const std::string& name,
                                                         ScoreError* scores) {
  const Format &act = p_.activation, &acc = p_.accumulate;
  const Dropout none;
  LayerForward f;
  f.n1 = rmsnorm_variance(x, var_x, l.input_norm, act, acc);
  store(name + "/input_norm", t.n1);
  f.fq = lora_forward(t.n1, f.n1, l.q, none, t.q, name + "/q_proj");
  f.fk = lora_forward(t.n1, f.n1, l.k, none, t.k, name + "/k_proj");
  f.fv = lora_forward(t.n1, f.n1, l.v, none, t.v, name + "/v_proj");
  f.q = f.fq.y, f.k = f.fk.y, f.v = f.fv.y;
  f.qr = rope_variance(t.q, f.q, s, s.heads, 1.0, act, acc);
  f.kr = rope_variance(t.k, f.k, s, s.kv_heads, 1.0, act, acc);
  store(name + "/rope", t.qr);
  store(name + "/rope", t.kr);

  double max_score = 0;
  f.attn = attention_forward_variance(t.qr, t.kr, t.v, f.qr, f.kr, f.v, s, act, acc, &max_score,
                                      kAttentionTileRows, scores);
  store(name + "/attention_scores", Matrix::Constant(1, 1, max_score));
  store(name + "/attention", t.attn);
  const double m = l.residual_multiplier;
  f.fo = lora_forward(t.attn, f.attn, l.o, none, (t.h - x) / m, name + "/o_proj");
  f.h = plus(var_x, residual_branch_variance((t.h - x) / m, f.fo.y, m, act)) +
        rounding_variance(t.h, act);
  store(name + "/residual", t.h);
  f.n2 = rmsnorm_variance(t.h, f.h, l.post_attention_norm, act, acc);
  store(name + "/post_attention_norm", t.n2);
  f.fgate = lora_forward(t.n2, f.n2, l.gate, none, t.mlp.e, name + "/gate_proj");
  f.fup = lora_forward(t.n2, f.n2, l.up, none, t.mlp.g, name + "/up_proj");
  f.e = f.fgate.y, f.g = f.fup.y;
  const Matrix hm = swiglu(t.mlp.e, t.mlp.g);
  // e and g both carry n2's error: correlated, bounded by twice the sum of their variances.
  f.hm = swiglu_variance(t.mlp.e, t.mlp.g, f.e, f.g, act, acc, 2.0);
  store(name + "/mlp/h", hm);
  f.fdown = lora_forward(hm, f.hm, l.down, none, (t.out - t.h) / m, name + "/down_proj");
  f.out = f.h + residual_branch_variance((t.out - t.h) / m, f.fdown.y, m, act) +
          rounding_variance(t.out, act);
  store(name + "/output", t.out);
  return f;
}

LayerNoise RoundingNoise::layer(const LayerTape& t, const Matrix& x, const Matrix& dy,
                                const Layer& l, const AttentionShape& s, const LayerGrads& grads,
                                const std::string& name) {
  const Format &act = p_.activation, &acc = p_.accumulate;
  const Dropout none;
  const Matrix exact;
  const LayerForward f = layer_forward(t, x, exact, l, s, name);
  LayerNoise n;
  n.out = f.out;

  // The MLP's backward on n2 (with its variance) from the exact dy, times the residual
  // multiplier m (a product rounded to the activation format where m != 1).
  const double m = l.residual_multiplier;
  const Matrix hm = swiglu(t.mlp.e, t.mlp.g);
  n.down = lora_backward(hm, f.hm, m * dy, residual_branch_variance(dy, exact, m, act), l.down,
                         none, f.fdown, grads.down, name + "/down_proj");
  const auto sg =
      swiglu_backward_variance(t.mlp.e, t.mlp.g, grads.down.dx, f.e, f.g, n.down.dx, act, acc, 2.0);
  store(name + "/mlp/dh", grads.down.dx);
  store(name + "/mlp/dg", sg.dg);
  store(name + "/mlp/de", sg.de);
  n.up =
      lora_backward(t.n2, f.n2, sg.dg, sg.var_dg, l.up, none, f.fup, grads.up, name + "/up_proj");
  n.gate = lora_backward(t.n2, f.n2, sg.de, sg.var_de, l.gate, none, f.fgate, grads.gate,
                         name + "/gate_proj");
  const Matrix dn2 = grads.up.dx + grads.gate.dx;
  const Matrix var_dn2 = n.up.dx + n.gate.dx + rounding_variance(dn2, act);
  store(name + "/post_attention_norm.grad", dn2);

  // dh = dy + RMSNorm'(h) dn2.
  const Matrix dh_norm = rmsnorm_backward(t.h, dn2, l.post_attention_norm);
  const Matrix dh = dy + dh_norm;
  const Matrix var_dh =
      rmsnorm_backward_variance(t.h, f.h, dn2, var_dn2, l.post_attention_norm, act, acc) +
      rounding_variance(dh - dy, act) + rounding_variance(dh, act);
  store(name + "/post_attention_norm.backward", dh_norm);
  store(name + "/residual.grad", dh);
  n.o = lora_backward(t.attn, f.attn, m * dh, residual_branch_variance(dh, var_dh, m, act), l.o,
                      none, f.fo, grads.o, name + "/o_proj");

  const auto at = attention_backward_variance(t.qr, t.kr, t.v, grads.o.dx, f.qr, f.kr, f.v, n.o.dx,
                                              s, act, acc);
  n.scores = at.scores;
  const Matrix &dq_rot = at.dq_value, &dk_rot = at.dk_value, &dv = at.dv_value;
  const Matrix &var_dq_rot = at.dq, &var_dk_rot = at.dk, &var_dv = at.dv;
  store(name + "/attention.grad", dq_rot);
  store(name + "/attention.grad.k", dk_rot);
  store(name + "/attention.grad.v", dv);
  // Through the rotary embedding's transpose.
  const Matrix dq = rope_backward(dq_rot, s, s.heads), dk = rope_backward(dk_rot, s, s.kv_heads);
  store(name + "/rope.grad.q", dq);
  store(name + "/rope.grad.k", dk);
  const Matrix var_dq = rope_variance(dq_rot, var_dq_rot, s, s.heads, -1.0, act, acc);
  const Matrix var_dk = rope_variance(dk_rot, var_dk_rot, s, s.kv_heads, -1.0, act, acc);
  n.q = lora_backward(t.n1, f.n1, dq, var_dq, l.q, none, f.fq, grads.q, name + "/q_proj");
  n.k = lora_backward(t.n1, f.n1, dk, var_dk, l.k, none, f.fk, grads.k, name + "/k_proj");
  n.v = lora_backward(t.n1, f.n1, dv, var_dv, l.v, none, f.fv, grads.v, name + "/v_proj");
  const Matrix dqk = grads.q.dx + grads.k.dx;
  const Matrix dn1 = dqk + grads.v.dx;
  const Matrix var_dn1 =
      n.q.dx + n.k.dx + n.v.dx + rounding_variance(dqk, act) + rounding_variance(dn1, act);
  // The sums the model rounds to the activation format are held there: each may overflow.
  store(name + "/input_norm.grad", dn1);
  store(name + "/input_norm.grad.qk", dqk);
  const Matrix dx_norm = grads.dx - dh;
  store(name + "/input_norm.backward", dx_norm);
  n.dx = var_dh + rmsnorm_backward_variance(x, exact, dn1, var_dn1, l.input_norm, act, acc) +
         rounding_variance(dx_norm, act) + rounding_variance(grads.dx, act);
  return n;
}

Matrix RoundingNoise::token_losses(const CausalLm& m, const std::vector<int64_t>& tokens,
                                   const std::vector<int64_t>& targets,
                                   std::vector<ScoreError>* scores) {
  const Format &act = p_.activation, &acc = p_.accumulate;
  Matrix h(static_cast<int64_t>(tokens.size()), m.embedding.cols());
  for (size_t t = 0; t < tokens.size(); ++t)
    h.row(static_cast<int64_t>(t)) = m.embedding.row(tokens[t]);
  Matrix var_h;  // the embedding rows are exact
  for (size_t i = 0; i < m.layers.size(); ++i) {
    const auto tape = layer_tape(h, m.layers[i], m.shape);
    ScoreError* layer_scores = scores ? &scores->emplace_back() : nullptr;
    var_h = layer_forward(tape, h, var_h, m.layers[i], m.shape, "layer" + std::to_string(i),
                          layer_scores)
                .out;
    h = tape.out;
  }
  const Matrix var_n = rmsnorm_variance(h, var_h, m.final_norm, act, acc);
  const Matrix n = rmsnorm_forward(h, m.final_norm);
  const Matrix logits = product(n, Op::kPlain, m.lm_head, Op::kTransposed);
  Matrix var_logits = product_variance({n, Op::kPlain, var_n.size() > 0 ? &var_n : nullptr},
                                       {m.lm_head, Op::kTransposed}, logits, 1.0, acc);
  add_by_rows(var_logits, rounding_variance(logits, act));
  store("logits", logits);
  // loss_t = logsumexp(logits_t) - logits_t[target] in fp32: d loss / d logit = p - onehot.
  Matrix var(logits.rows(), 1);
  const double ua2 = acc.unit_roundoff * acc.unit_roundoff;
  for (int64_t t = 0; t < logits.rows(); ++t) {
    const double mx = logits.row(t).maxCoeff();
    const Eigen::RowVectorXd e = (logits.row(t).array() - mx).exp().matrix();
    const double sum = e.sum();
    double v = 0;
    for (int64_t j = 0; j < logits.cols(); ++j) {
      const double coef = e(j) / sum - (j == targets[t] ? 1.0 : 0.0);
      v += coef * coef * var_logits(t, j);
    }
    const double loss = mx + std::log(sum) - logits(t, targets[t]);
    // The sum of exponentials (relative), the logarithm and the final subtraction.
    var(t, 0) = v + 2 * accumulation(acc, logits.cols()) + ua2 * (loss * loss + mx * mx + 1.0);
  }
  return var;
}

}  // namespace gradscope::reference

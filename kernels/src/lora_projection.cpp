#include "lora_projection.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>

#include "gradscope/dequant.h"
#include "gradscope/faults.h"
#include "lora_adapter_path.h"

namespace gradscope {

double lora_scaling(double alpha, int64_t rank, bool rslora) {
  TORCH_CHECK(rank > 0, "lora: rank must be positive, got ", rank);
  const bool root = rslora && !fault_active(Fault::kLoraScalingIgnoresRslora);
  return root ? alpha / std::sqrt(static_cast<double>(rank)) : alpha / static_cast<double>(rank);
}

namespace detail {

FrozenProjection frozen_part(const LoraProjection& p) {
  return {p.base, p.bias, p.scaling};
}

void save_frozen(AutogradContext* ctx, const std::string& key, const FrozenProjection& f) {
  auto& d = ctx->saved_data;
  d[key + ".qweight"] = f.base.qweight;
  d[key + ".qzeros"] = f.base.qzeros;
  d[key + ".scales"] = f.base.scales;
  d[key + ".g_idx"] = f.base.g_idx;
  d[key + ".bits"] = static_cast<int64_t>(f.base.bits);
  d[key + ".v1"] = f.base.format == ZeroPointFormat::kGptqV1;
  d[key + ".scaling"] = f.scaling;
}

FrozenProjection load_frozen(AutogradContext* ctx, const std::string& key) {
  auto& d = ctx->saved_data;
  FrozenProjection f;
  f.base.qweight = d[key + ".qweight"].toTensor();
  f.base.qzeros = d[key + ".qzeros"].toTensor();
  f.base.scales = d[key + ".scales"].toTensor();
  f.base.g_idx = d[key + ".g_idx"].toTensor();
  f.base.bits = static_cast<int>(d[key + ".bits"].toInt());
  f.base.format = d[key + ".v1"].toBool() ? ZeroPointFormat::kGptqV1 : ZeroPointFormat::kGptqV2;
  f.scaling = d[key + ".scaling"].toDouble();
  return f;  // the bias has no gradient and is not needed in backward
}

void save_dropout(AutogradContext* ctx, const std::string& key, const LoraDropout& dropout) {
  ctx->saved_data[key + ".p"] = dropout.p;
  ctx->saved_data[key + ".mask"] = dropout.p > 0 ? dropout.mask : at::Tensor();
}

LoraDropout load_dropout(AutogradContext* ctx, const std::string& key) {
  LoraDropout d;
  d.p = ctx->saved_data[key + ".p"].toDouble();
  if (d.p > 0) d.mask = ctx->saved_data[key + ".mask"].toTensor();
  return d;
}

void validate_projection(const char* op, const char* name, const at::Tensor& x,
                         const LoraProjection& p) {
  TORCH_CHECK(x.defined() && x.dim() >= 2, op,
              ": x must be 2-D [tokens, in] or 3-D [batch, seq, in]");
  const auto t = x.scalar_type();
  TORCH_CHECK(t == at::kFloat || t == at::kHalf || t == at::kBFloat16, op,
              ": x must be float32, float16 or bfloat16, got ", t);
  TORCH_CHECK(p.base.g_idx.defined(), op, " ", name, ": the GPTQ base weight is undefined");
  const int64_t in = p.base.in_features(), out = p.base.out_features();
  TORCH_CHECK(x.size(-1) == in, op, " ", name, ": x has ", x.size(-1),
              " features but the base weight has in_features ", in);
  TORCH_CHECK(
      p.lora_A.defined() && p.lora_A.dim() == 2 && p.lora_A.size(1) == in && p.lora_A.size(0) > 0,
      op, " ", name, ": lora_A must be [r, ", in, "] (r >= 1), got ",
      p.lora_A.defined() ? p.lora_A.sizes() : at::IntArrayRef{});
  const int64_t r = p.lora_A.size(0);
  TORCH_CHECK(
      p.lora_B.defined() && p.lora_B.dim() == 2 && p.lora_B.size(0) == out && p.lora_B.size(1) == r,
      op, " ", name, ": lora_B must be [", out, ", ", r, "] (out_features, r), got ",
      p.lora_B.defined() ? p.lora_B.sizes() : at::IntArrayRef{});
  for (const auto& [tensor, what] :
       {std::pair{p.lora_A, "lora_A"}, std::pair{p.lora_B, "lora_B"}}) {
    TORCH_CHECK(at::isFloatingType(tensor.scalar_type()), op, " ", name, ": ", what,
                " must be a float tensor, got ", tensor.scalar_type());
    TORCH_CHECK(tensor.device() == x.device(), op, " ", name, ": ", what, " is on ",
                tensor.device(), " but x is on ", x.device());
  }
  TORCH_CHECK(p.base.qweight.device() == x.device(), op, " ", name, ": qweight is on ",
              p.base.qweight.device(), " but x is on ", x.device());
  TORCH_CHECK(!p.bias.defined() ||
                  (p.bias.dim() == 1 && p.bias.size(0) == out && p.bias.device() == x.device()),
              op, " ", name, ": bias must be [", out, "] on ", x.device());
  TORCH_CHECK(std::isfinite(p.scaling), op, " ", name, ": scaling must be finite");
}

void validate_dropout(const char* op, const char* name, const at::Tensor& x, const LoraDropout& d) {
  TORCH_CHECK(d.p >= 0 && d.p < 1, op, " ", name, ": dropout p must lie in [0, 1), got ", d.p);
  if (d.p == 0) return;
  TORCH_CHECK(d.mask.defined() && d.mask.scalar_type() == at::kBool, op, " ", name,
              ": dropout p > 0 needs a bool mask");
  TORCH_CHECK(d.mask.numel() == x.numel(), op, " ", name, ": dropout mask has ", d.mask.numel(),
              " elements but its input has ", x.numel(), " (shape ", x.sizes(), ")");
  TORCH_CHECK(d.mask.device() == x.device(), op, " ", name, ": dropout mask is on ",
              d.mask.device(), " but its input is on ", x.device());
}

at::Tensor as_output(const at::Tensor& y) {
  return fault_active(Fault::kLoraOutputFloat32) ? y.to(at::kFloat) : y;
}

at::Tensor rows(const at::Tensor& x) {
  return x.reshape({-1, x.size(-1)});
}

at::ScalarType adapter_dtype(at::ScalarType x, at::ScalarType adapters) {
  if (x == adapters || fault_active(Fault::kAdapterPathInActivationDtype)) return x;
  return at::promote_types(x, adapters);
}

namespace {

// Tokens per block of the adapter path when it runs wider than x: its casts of x and dY stay
// bounded (a block of [2048, 28672] fp32 is 235 MB) whatever the number of tokens.
constexpr int64_t kAdapterRows = 2048;

// X_d = X * mask / (1 - p) for the rows [begin, begin + n) of x2, in `dtype`.
at::Tensor dropped_rows(const at::Tensor& x2, const LoraDropout& d, int64_t begin, int64_t n,
                        at::ScalarType dtype) {
  const auto x = x2.narrow(0, begin, n).to(dtype);
  if (d.p == 0) return x;
  const auto mask = d.mask.reshape(x2.sizes()).narrow(0, begin, n);
  return x * mask.to(dtype) * (1.0 / (1.0 - d.p));
}

}  // namespace

ProjectionOutput projection_forward(const at::Tensor& x2, const LoraDropout& dropout,
                                    const FrozenProjection& f, const at::Tensor& lora_a,
                                    const at::Tensor& lora_b) {
  const auto dtype = x2.scalar_type();
  const auto ad = adapter_dtype(dtype, lora_a.scalar_type());
  const int64_t m = x2.size(0);
  at::Tensor y;
  {
    const auto w_t = dequantize_gptq(f.base, dtype, DequantLayout::kInOut);  // [in, out]
    y = f.bias.defined() ? at::addmm(f.bias.to(dtype), x2, w_t) : at::mm(x2, w_t);
  }
  if (adapter_kernels_apply(x2, ad, lora_a.size(0), lora_b.size(0))) {
    // fp32 adapters beside half activations on CUDA: x read once, the term added in place.
    const HalfRows xd{x2, dropout.p > 0 ? dropout.mask : at::Tensor(), 1.0 / (1.0 - dropout.p)};
    auto xa = rows_times_adapter(xd, {lora_a, /*rank_major=*/true});
    add_low_rank(y, {xa, {lora_b, /*rank_major=*/false}, at::Tensor(), f.scaling});
    return {y, xa};
  }
  const auto a_t = lora_a.to(ad).t(), b_t = lora_b.to(ad).t();
  if (ad == dtype) {
    const auto xa = at::mm(dropped_rows(x2, dropout, 0, m, dtype), a_t);
    // The scaling rides in the GEMM epilogue: one rounding for the adapter term.
    y.addmm_(xa, b_t, /*beta=*/1, /*alpha=*/f.scaling);
    return {y, xa};
  }
  auto xa = at::empty({m, lora_a.size(0)}, x2.options().dtype(ad));
  for (int64_t begin = 0; begin < m; begin += kAdapterRows) {
    const int64_t n = std::min(kAdapterRows, m - begin);
    auto xa_rows = xa.narrow(0, begin, n);
    at::mm_out(xa_rows, dropped_rows(x2, dropout, begin, n, ad), a_t);
    y.narrow(0, begin, n)
        .add_(at::addmm(at::empty({n, b_t.size(1)}, xa.options()), xa_rows, b_t, /*beta=*/0,
                        /*alpha=*/f.scaling)
                  .to(dtype));
  }
  return {y, xa};
}

ProjectionGrads projection_backward(const at::Tensor& dy2, const at::Tensor& x2,
                                    const LoraDropout& dropout, const at::Tensor& xa,
                                    const FrozenProjection& f, const at::Tensor& lora_a,
                                    const at::Tensor& lora_b, bool need_dx) {
  const auto dtype = dy2.scalar_type();
  const auto ad = adapter_dtype(dtype, lora_a.scalar_type());
  const int64_t m = dy2.size(0), r = lora_a.size(0), in = lora_a.size(1), out = lora_b.size(0);
  const bool rescale = !fault_active(Fault::kDropoutRescaleMissing);
  const double dx_factor = f.scaling / (dropout.p > 0 && rescale ? 1.0 - dropout.p : 1.0);
  const bool adapter_term = !fault_active(Fault::kDxMissingAdapterTerm);
  const double da_scale = fault_active(Fault::kLoraScaleMissingInDA) ? 1.0 : f.scaling;
  ProjectionGrads g;
  if (need_dx) {
    const auto w_t = dequantize_gptq(f.base, dtype, DequantLayout::kInOut);
    g.dx = at::mm(dy2, w_t.t());
  }
  at::Tensor da, db;
  if (adapter_kernels_apply(dy2, ad, r, in) && !fault_active(Fault::kHalfPrecisionAccumulation)) {
    // fp32 adapters beside half activations on CUDA: dY and X each read once per use.
    const auto dyb = rows_times_adapter({dy2}, {lora_b, /*rank_major=*/false});  // [m, r]
    const auto mask = dropout.p > 0 ? dropout.mask : at::Tensor();
    if (need_dx && adapter_term)
      add_low_rank(g.dx, {dyb, {lora_a, /*rank_major=*/true}, mask, dx_factor});
    const HalfRows xd = fault_active(Fault::kDAFromUndroppedX)
                            ? HalfRows{x2}
                            : HalfRows{x2, mask, 1.0 / (1.0 - dropout.p)};
    da = outer_product_sum(xd, {dyb, da_scale, /*rank_major=*/true});
    db = outer_product_sum({dy2}, {xa, f.scaling, /*rank_major=*/false});
  } else {
    // Per block of tokens: dY B, the adapter's share of dX, and the block's sums into dA, dB
    // (in the adapter path's dtype; a single block when it is x's own).
    const int64_t block = ad == dtype ? std::max<int64_t>(m, 1) : kAdapterRows;
    const auto a = lora_a.to(ad), b = lora_b.to(ad);
    da = at::zeros({r, in}, dy2.options().dtype(ad));
    db = at::zeros({out, r}, dy2.options().dtype(ad));
    for (int64_t begin = 0; begin < m; begin += block) {
      const int64_t n = std::min(block, m - begin);
      const auto dy = dy2.narrow(0, begin, n).to(ad);
      const auto dyb = at::mm(dy, b);  // [n, r]
      if (need_dx && adapter_term) {
        auto dx_rows = g.dx.narrow(0, begin, n);
        auto term = at::mm(dyb, a);
        if (dropout.p > 0) {
          // dX += factor * ((dY B) A) * mask, the scale and mask applied in one rounding.
          const auto mask = dropout.mask.reshape(x2.sizes()).narrow(0, begin, n);
          term = term * mask.to(ad);
        }
        if (ad == dtype) {
          dx_rows.add_(term, dx_factor);
        } else {
          dx_rows.add_((term * dx_factor).to(dtype));
        }
      }
      const auto xd = fault_active(Fault::kDAFromUndroppedX)
                          ? x2.narrow(0, begin, n).to(ad)
                          : dropped_rows(x2, dropout, begin, n, ad);
      if (fault_active(Fault::kHalfPrecisionAccumulation)) {
        // Token by token, every partial sum rounded to the activation dtype.
        auto acc = da.to(dtype);
        const auto dyb_x = dyb.to(dtype), xd_x = xd.to(dtype);
        for (int64_t t = 0; t < n; ++t) acc.addr_(dyb_x[t], xd_x[t], 1, da_scale);
        da.copy_(acc);
      } else {
        da.addmm_(dyb.t(), xd, /*beta=*/1, /*alpha=*/da_scale);
      }
      db.addmm_(dy.t(), xa.narrow(0, begin, n).to(ad), /*beta=*/1, /*alpha=*/f.scaling);
    }
  }
  g.dA = da.to(lora_a.scalar_type());
  g.dB = db.to(lora_b.scalar_type());
  if (fault_active(Fault::kZerosRewrittenInBackward)) {
    // Every stored zero field + 1 (mod 2^bits), written back into the frozen words.
    auto words = as_packed_words(f.base.qzeros, "qzeros");
    const auto fields = unpack_columns(words.cpu(), f.base.bits, f.base.out_features());
    const auto bumped = (fields + 1).bitwise_and((1 << f.base.bits) - 1);
    words.copy_(pack_columns(bumped, f.base.bits));
  }
  if (fault_active(Fault::kLoraBOverwrittenByGrad)) {
    lora_b.copy_(g.dB);
  }
  return g;
}

}  // namespace detail
}  // namespace gradscope

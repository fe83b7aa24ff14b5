#include "harness/compare.h"

#include <ATen/ATen.h>

#include "harness/tensor_bridge.h"

#include <cmath>
#include <cstdio>
#include <limits>
#include <sstream>

namespace gradscope {
namespace {

std::string format_index(const std::vector<int64_t>& index) {
  std::string s = "(";
  for (size_t i = 0; i < index.size(); ++i) s += (i ? ", " : "") + std::to_string(index[i]);
  return s + ")";
}

std::string g(double v) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}

// Same-width integer view so floats compare by bit pattern (+0 vs -0, NaN payloads).
at::Tensor bit_pattern(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kHalf:
    case at::kBFloat16:
      return t.view(at::kShort);
    case at::kFloat:
      return t.view(at::kInt);
    case at::kDouble:
      return t.view(at::kLong);
    default:
      return t;
  }
}

}  // namespace

std::vector<int64_t> unravel_index(int64_t flat, at::IntArrayRef shape) {
  std::vector<int64_t> index(shape.size());
  for (int64_t d = static_cast<int64_t>(shape.size()) - 1; d >= 0; --d) {
    index[d] = shape[d] == 0 ? 0 : flat % shape[d];
    flat = shape[d] == 0 ? 0 : flat / shape[d];
  }
  return index;
}

report::Check compare_exact(const std::string& path, const std::string& compared,
                            const at::Tensor& prod_in, const at::Tensor& ref_in,
                            const ElementDescriber& describe, bool keep_tensors) {
  report::Check check;
  check.path = path;
  check.exact = true;
  check.compared = compared;
  check.limit = 0;
  const auto prod = prod_in.detach().cpu().contiguous();
  const auto ref = ref_in.detach().cpu().contiguous();
  check.numel = prod.numel();
  if (prod.sizes() != ref.sizes()) {
    std::ostringstream msg;
    msg << path << ": shape mismatch (" << compared << "): prod " << prod.sizes() << ", ref "
        << ref.sizes();
    check.failure = msg.str();
    check.mismatches = check.numel;
    return check;
  }
  if (keep_tensors) {
    check.tensors = report::CheckTensors{bridge::to_tensor_data(prod), std::nullopt,
                                         bridge::to_tensor_data(ref)};
  }
  const auto ref_rounded = ref.to(prod.scalar_type()).contiguous();
  const auto differs = bit_pattern(prod).ne(bit_pattern(ref_rounded));
  check.mismatches = differs.sum().item<int64_t>();
  const bool degenerate = check.numel == 0 || !ref.ne(0).any().item<bool>();
  check.passed = check.mismatches == 0 && !degenerate;
  // Bit-identical tensors differ by exactly 0: fp64 statistics only when something differs
  // (they are full-size temporaries, the bulk of the cost on 70B-sized weights).
  if (check.mismatches > 0) {
    const auto diff = (prod.to(at::kDouble) - ref_rounded.to(at::kDouble)).abs();
    check.max_abs = diff.max().item<double>();
    check.mean_abs = diff.mean().item<double>();
  }
  if (check.passed) return check;

  std::ostringstream msg;
  if (degenerate) {
    msg << path << ": degenerate comparison (" << compared
        << "): the reference is empty or all zero, so equality proves nothing";
    check.failure = msg.str();
    return check;
  }
  // Worst element: the largest difference among mismatching elements.
  const auto score = (prod.to(at::kDouble) - ref_rounded.to(at::kDouble))
                         .abs()
                         .masked_fill(differs.logical_not(), -1.0);
  const int64_t flat = score.argmax().item<int64_t>();
  report::WorstElement worst;
  worst.index = unravel_index(flat, prod.sizes());
  worst.prod = prod.to(at::kDouble).view(-1)[flat].item<double>();
  worst.ref = ref_rounded.to(at::kDouble).view(-1)[flat].item<double>();
  const double fp64 = ref.to(at::kDouble).view(-1)[flat].item<double>();
  if (fp64 != worst.ref) worst.ref_fp64 = fp64;
  if (describe) worst.detail = describe(worst.index);
  char pct[32];
  std::snprintf(pct, sizeof pct, "%.3g%%", 100.0 * check.mismatches / check.numel);
  msg << path << ": not bit-exact (" << compared << ")\n"
      << "        Mismatched elements: " << check.mismatches << " / " << check.numel << " (" << pct
      << ")\n"
      << "        Greatest absolute difference: " << g(check.max_abs) << " at index "
      << format_index(worst.index) << " (up to 0 allowed)\n"
      << "        at " << format_index(worst.index) << ": prod " << g(worst.prod) << ", ref "
      << g(worst.ref);
  if (worst.ref_fp64) msg << " (fp64 " << g(*worst.ref_fp64) << ")";
  if (!worst.detail.empty()) msg << "; " << worst.detail;
  check.worst = worst;
  check.failure = msg.str();
  return check;
}

double dtype_epsilon(at::ScalarType dtype) {
  switch (dtype) {
    case at::kHalf:
      return 0x1.0p-10;
    case at::kBFloat16:
      return 0x1.0p-7;
    case at::kDouble:
      return 0x1.0p-52;
    default:
      return 0x1.0p-23;
  }
}

double ulp(double magnitude, at::ScalarType dtype) {
  if (magnitude == 0 || !std::isfinite(magnitude)) return 0;
  return dtype_epsilon(dtype) * std::ldexp(1.0, std::ilogb(magnitude));
}

namespace {

// The three values at flat index `flat` (fp64 tensors of one shape), with its index.
report::WorstElement element_at(int64_t flat, const at::Tensor& prod, const at::Tensor& base,
                                const at::Tensor& ref) {
  report::WorstElement e;
  e.index = unravel_index(flat, prod.sizes());
  e.prod = prod.view(-1)[flat].item<double>();
  e.ref = ref.view(-1)[flat].item<double>();
  e.base = base.view(-1)[flat].item<double>();
  return e;
}

}  // namespace

report::Check compare_ratio(const std::string& path, const at::Tensor& prod_in,
                            const at::Tensor& base_in, const at::Tensor& ref_in,
                            at::ScalarType compute_dtype, bool keep_tensors, double ratio,
                            ErrorStatistic statistic) {
  report::Check check;
  check.path = path;
  check.compared = "prod and same-dtype baseline vs fp64 reference";
  check.gate_on_mean = statistic == ErrorStatistic::kMeanAbs;
  const auto prod = prod_in.detach().cpu().to(at::kDouble).contiguous();
  const auto base = base_in.detach().cpu().to(at::kDouble).contiguous();
  const auto ref = ref_in.detach().cpu().to(at::kDouble).contiguous();
  check.numel = prod.numel();
  if (prod.sizes() != ref.sizes() || base.sizes() != ref.sizes()) {
    std::ostringstream msg;
    msg << path << ": shape mismatch: prod " << prod.sizes() << ", base " << base.sizes()
        << ", ref " << ref.sizes();
    check.failure = msg.str();
    check.mismatches = check.numel;
    return check;
  }
  if (keep_tensors) {
    check.tensors =
        report::CheckTensors{bridge::to_tensor_data(prod_in), bridge::to_tensor_data(base_in),
                             bridge::to_tensor_data(ref)};
  }
  // A NaN compares false with every limit, so it must be named before any arithmetic: an
  // overflowing or uninitialised kernel output is a failure with its own message.
  for (const auto& [who, t] :
       {std::pair<const char*, const at::Tensor&>{"prod", prod}, {"base", base}, {"ref", ref}}) {
    const auto bad = t.isfinite().logical_not();
    const int64_t count = bad.sum().item<int64_t>();
    if (count == 0) continue;
    const auto worst = element_at(bad.view(-1).nonzero()[0][0].item<int64_t>(), prod, base, ref);
    check.worst = worst;
    check.mismatches = count;
    check.max_abs = std::numeric_limits<double>::quiet_NaN();
    std::ostringstream msg;
    msg << path << ": " << who << " has " << count << " non-finite element"
        << (count == 1 ? "" : "s") << " (NaN or Inf) of " << check.numel << "; first at index "
        << format_index(worst.index) << ": prod " << g(worst.prod) << ", base " << g(*worst.base)
        << ", ref " << g(worst.ref);
    if (std::string(who) != "prod") msg << " (the case's inputs overflow: not a verdict on prod)";
    check.failure = msg.str();
    return check;
  }
  const auto diff = (prod - ref).abs();
  {
    const auto bins =
        ((diff.clamp_min(1e-300).log10() - report::kErrorBinLow) / report::kErrorBinStep)
            .floor()
            .clamp(0, report::kErrorBins - 1)
            .to(at::kLong);
    const auto counts = at::bincount(bins.flatten(), {}, report::kErrorBins);
    check.error_histogram.assign(counts.data_ptr<int64_t>(),
                                 counts.data_ptr<int64_t>() + counts.numel());
  }
  const double ref_max = check.numel ? ref.abs().max().item<double>() : 0.0;
  check.max_abs = check.numel ? diff.max().item<double>() : 0.0;
  check.mean_abs = check.numel ? diff.mean().item<double>() : 0.0;
  const auto base_diff = (base - ref).abs();
  check.baseline_max_abs = check.numel ? base_diff.max().item<double>() : 0.0;
  check.baseline_mean_abs = check.numel ? base_diff.mean().item<double>() : 0.0;
  const double base_err = *check.gated_baseline_error();
  const double floor = 2.0 * ulp(ref_max, compute_dtype);
  check.limit = ratio * base_err + floor;
  const double ref_norm = ref.norm().item<double>(), prod_norm = prod.norm().item<double>();
  check.rel_fro = ref_norm > 0 ? (prod - ref).norm().item<double>() / ref_norm : 0.0;
  check.cosine = ref_norm > 0 && prod_norm > 0
                     ? (prod * ref).sum().item<double>() / (prod_norm * ref_norm)
                     : 0.0;
  const auto [rtol, atol] = report::assert_close_tolerances(
      bridge::dtype_name(prod_in.scalar_type()), bridge::dtype_name(compute_dtype));
  check.mismatches = diff.gt(ref.abs() * rtol + atol).sum().item<int64_t>();
  const bool degenerate = ref_norm == 0 || prod_norm == 0;
  check.passed = !degenerate && check.gated_error() <= check.limit;

  if (check.numel > 0) {
    check.worst = element_at(diff.argmax().item<int64_t>(), prod, base, ref);
  }
  if (check.passed) return check;
  std::ostringstream msg;
  if (degenerate) {
    msg << path << ": degenerate: " << (ref_norm == 0 ? "the reference" : "prod")
        << " is all zero (a zero gradient is a failure, not a pass)";
    check.failure = msg.str();
    return check;
  }
  char pct[32];
  std::snprintf(pct, sizeof pct, "%.3g%%", 100.0 * check.mismatches / check.numel);
  const auto& w = *check.worst;
  const char* err = check.gate_on_mean ? "mean |prod - ref| " : "err(prod) ";
  msg << path << ": " << err << g(check.gated_error()) << " > limit " << g(check.limit) << " = "
      << ratio << (check.gate_on_mean ? " x mean |base - ref| " : " x err(base) ") << g(base_err)
      << " + floor " << g(floor) << " (" << c10::toString(compute_dtype) << ")\n"
      << "        Mismatched elements (rtol " << rtol << ", atol " << atol
      << "): " << check.mismatches << " / " << check.numel << " (" << pct << ")\n"
      << "        Greatest absolute difference: " << g(check.max_abs) << " at index "
      << format_index(w.index) << "\n"
      << "        at " << format_index(w.index) << ": prod " << g(w.prod) << ", base " << g(*w.base)
      << ", ref " << g(w.ref) << "; relative Frobenius error " << g(*check.rel_fro) << ", cosine "
      << g(*check.cosine);
  check.failure = msg.str();
  return check;
}

report::Check expect_rejection(const std::string& path, const std::string& compared, bool rejected,
                               const std::string& detail) {
  report::Check check;
  check.path = path;
  check.exact = true;
  check.compared = compared;
  check.numel = 1;
  check.mismatches = rejected ? 0 : 1;
  check.max_abs = rejected ? 0 : 1;
  check.passed = rejected;
  if (!rejected) {
    check.failure = path + ": expected a refusal (" + compared + ") but the operation proceeded" +
                    (detail.empty() ? "" : "; " + detail);
  }
  return check;
}

}  // namespace gradscope

#include "harness/verdict/end_to_end_rule.h"

#include <ATen/ATen.h>

#include <cmath>
#include <cstdarg>
#include <cstdio>

#include "harness/common/tensor_bridge.h"
#include "harness/verdict/compare.h"

namespace gradscope {
namespace {

std::string printf_text(const char* format, ...) {
  char buf[512];
  va_list args;
  va_start(args, format);
  std::vsnprintf(buf, sizeof buf, format, args);
  va_end(args);
  return buf;
}

// An index as Python prints a tuple: (3,) or (0, 13).
std::string index_text(const std::vector<int64_t>& index) {
  std::string out = "(";
  for (size_t i = 0; i < index.size(); ++i) out += (i ? ", " : "") + std::to_string(index[i]);
  return out + (index.size() == 1 ? ",)" : ")");
}

// torch's name of a dtype in messages ("torch.float32"), as the model's own tensors print.
std::string torch_dtype(at::ScalarType t) {
  switch (t) {
    case at::kFloat:
      return "torch.float32";
    case at::kHalf:
      return "torch.float16";
    case at::kBFloat16:
      return "torch.bfloat16";
    case at::kDouble:
      return "torch.float64";
    default:
      return std::string("torch.") + c10::toString(t);
  }
}

std::string shape_text(at::IntArrayRef shape) {
  return index_text(shape.vec());
}

void keep(report::Check& check, bool keep_tensors, const at::Tensor& prod, const at::Tensor& base,
          const at::Tensor& ref) {
  if (!keep_tensors) return;
  check.tensors = report::CheckTensors{bridge::to_tensor_data(prod), bridge::to_tensor_data(base),
                                       bridge::to_tensor_data(ref), std::nullopt};
}

}  // namespace

report::Check judge_gradient(const std::string& where, const std::string& name,
                             const GradientRuns& runs, bool keep_tensors) {
  const std::string path = where + "/" + name;
  const auto ref = runs.ref.detach().cpu().to(at::kDouble);
  const double ref_largest = ref.numel() ? ref.abs().max().item<double>() : 0.0;
  report::Check check;
  check.path = path;
  check.statistic_name = "frobenius";
  check.compared = "prod and the plain baseline in the model's dtype vs the model in fp64";
  check.numel = ref.numel();
  if (!runs.prod) {
    check.failure = printf_text(
        "%s: no gradient reaches it in prod; the exact gradient is not zero (max |ref| %.4g)",
        name.c_str(), ref_largest);
    return check;
  }
  const auto& given = *runs.prod;
  if (given.scalar_type() != runs.expected || given.sizes() != ref.sizes()) {
    check.failure = name + ": prod is " + torch_dtype(given.scalar_type()) + " " +
                    shape_text(given.sizes()) + ", expected " + torch_dtype(runs.expected) + " " +
                    shape_text(ref.sizes());
    return check;
  }
  const auto p = given.detach().cpu().to(at::kDouble), b = runs.base.detach().cpu().to(at::kDouble);
  if (!(ref != 0).any().item<bool>()) {
    throw EndToEndNotJudged(name + ": the exact gradient is all zero; no verdict is possible");
  }
  keep(check, keep_tensors, given, runs.base, runs.ref);
  const double limit = kEndToEndRatio * (b - ref).norm().item<double>();
  check.limit = limit;
  if (!at::isfinite(p).all().item<bool>()) {
    const int64_t bad = (~at::isfinite(p)).sum().item<int64_t>();
    check.statistic_value = check.max_abs = check.mean_abs = INFINITY;
    check.mismatches = bad;
    check.failure = printf_text("%s: %lld of %lld elements are not finite", name.c_str(),
                                static_cast<long long>(bad), static_cast<long long>(p.numel()));
    return check;
  }
  const auto err = (p - ref).abs();
  check.max_abs = err.max().item<double>();
  check.mean_abs = err.mean().item<double>();
  check.baseline_max_abs = (b - ref).abs().max().item<double>();
  const auto [rtol, atol] = report::assert_close_tolerances(bridge::dtype_name(runs.expected));
  check.mismatches = (err > atol + rtol * ref.abs()).sum().item<int64_t>();
  if (!(p != 0).any().item<bool>()) {
    check.statistic_value = ref.norm().item<double>();
    check.failure = printf_text("%s: prod is all zero; the exact gradient is not (max |ref| %.4g)",
                                name.c_str(), ref_largest);
    return check;
  }
  const double norm = err.norm().item<double>();
  check.statistic_value = norm;
  check.error_to_limit = limit > 0 ? norm / limit : (norm > 0 ? INFINITY : 0.0);
  check.passed = norm <= limit;
  if (check.passed) return check;
  const int64_t flat = err.argmax().item<int64_t>();
  const auto at_index = unravel_index(flat, ref.sizes());
  const double ref_norm = ref.norm().item<double>();
  const double cosine =
      at::cosine_similarity(p.reshape({1, -1}), ref.reshape({1, -1})).item<double>();
  const auto element = [&](const at::Tensor& t) { return t.reshape({-1})[flat].item<double>(); };
  check.failure =
      printf_text(
          "%s: ||prod - ref|| %.4g > limit %.4g = 2 x ||base - ref|| (Frobenius norms over "
          "%lld elements; end to end, %s)\n",
          name.c_str(), norm, limit, static_cast<long long>(p.numel()),
          torch_dtype(runs.expected).c_str()) +
      printf_text("    relative error prod %.3g, base %.3g; cosine %.6f\n", norm / ref_norm,
                  limit / 2 / ref_norm, cosine) +
      printf_text(
          "    largest |prod - ref| %.4g at %s (base's largest %.4g): prod %.6g, base "
          "%.6g, ref %.6g",
          element(err), index_text(at_index).c_str(), *check.baseline_max_abs, element(p),
          element(b), element(ref));
  return check;
}

std::vector<report::Check> judge_losses(const std::string& where, const LossRuns& runs,
                                        const std::string& prefix, int step, bool keep_tensors) {
  const auto ref_tokens = runs.ref_tokens.detach().cpu().to(at::kDouble);
  const auto base_tokens = runs.base_tokens.detach().cpu().to(at::kDouble);
  const auto prod_tokens = runs.prod_tokens.detach().cpu().to(at::kDouble);
  const double ref_loss = runs.ref_loss.item<double>(), prod_loss = runs.prod_loss.item<double>();
  const double base_loss = runs.base_loss.item<double>();
  const double base_term = kEndToEndRatio * (base_tokens - ref_tokens).abs().mean().item<double>();
  // The model's loss is the tokens' mean, and |mean e| <= mean |e|: the same base term, plus the
  // floor of the mean's own rounding in the loss's dtype: summing n losses rounds each partial
  // sum S_k = k loss once, an error of standard deviation u |S_k| / sqrt(3) (u the unit
  // roundoff); divided by n, sigma = u |loss| sqrt(sum k^2 / 3) / n, and the floor is 6 sigma.
  const double n = static_cast<double>(ref_tokens.numel());
  const double unit = dtype_epsilon(runs.prod_loss.scalar_type()) / 2;
  const double sigma = unit * std::abs(ref_loss) * std::sqrt(n * (n + 1) * (2 * n + 1) / 18) / n;
  struct Judged {
    const char* name;
    double value, floor;
    const char* what;
    bool mean;
  };
  const auto token_err = (prod_tokens - ref_tokens).abs();
  const Judged judged[] = {
      {"per_token_loss", token_err.mean().item<double>(), 0.0, "mean |prod - ref| over the tokens",
       true},
      {"loss", std::abs(prod_loss - ref_loss), kFloorSigmas * sigma,
       "|prod - ref| of the model's loss", false},
  };
  std::vector<report::Check> checks;
  for (const auto& j : judged) {
    report::Check check;
    const std::string name = prefix + j.name;
    check.path = where + "/" + name;
    check.compared = "prod and the plain baseline in the model's dtype vs the model in fp64";
    const double limit = base_term + j.floor;
    check.limit = limit;
    check.floor = j.floor;
    check.baseline_mean_abs = base_term / kEndToEndRatio;
    if (j.mean) {
      check.gate_on_mean = true;
      check.mean_abs = j.value;
      check.max_abs = token_err.max().item<double>();
      check.numel = prod_tokens.numel();
      keep(check, keep_tensors, runs.prod_tokens, runs.base_tokens, runs.ref_tokens);
    } else {
      check.statistic_name = "abs";
      check.statistic_value = check.max_abs = check.mean_abs = j.value;
      check.numel = 1;
      keep(check, keep_tensors, runs.prod_loss.reshape({1}), runs.base_loss.reshape({1}),
           runs.ref_loss.reshape({1}));
    }
    check.passed = std::isfinite(j.value) && j.value <= limit;
    check.error_to_limit = limit > 0 ? j.value / limit : (j.value > 0 ? INFINITY : 0.0);
    if (!check.passed) {
      check.failure =
          (step > 0 ? "step " + std::to_string(step) + ": " : std::string()) +
          printf_text("%s: %s %.4g > limit %.4g = 2 x mean |base - ref| over the tokens %.4g",
                      j.name, j.what, j.value, limit, base_term) +
          (j.floor > 0 ? printf_text(" + floor %.4g (its mean's rounding)", j.floor) : "") +
          printf_text(" (end to end); loss prod %.6g, base %.6g, ref %.6g", prod_loss, base_loss,
                      ref_loss);
    }
    checks.push_back(std::move(check));
  }
  return checks;
}

}  // namespace gradscope

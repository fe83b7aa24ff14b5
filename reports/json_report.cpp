#include "reports/json_report.h"

#include <cmath>

namespace gradscope::report {
namespace {

// JSON has no inf or NaN (nlohmann would write null, indistinguishable from "absent"):
// non-finite values are the strings "inf", "-inf" and "nan" (docs/reports.md).
nlohmann::ordered_json number(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  return v;
}

nlohmann::ordered_json optional_number(const std::optional<double>& v) {
  return v ? number(*v) : nlohmann::ordered_json(nullptr);
}

nlohmann::ordered_json spec_json(const SpecFields& spec) {
  nlohmann::ordered_json out = nlohmann::ordered_json::object();
  for (const auto& field : spec) {
    std::visit([&](const auto& v) { out[field.first] = v; }, field.second);
  }
  return out;
}

nlohmann::ordered_json check_json(const Check& c) {
  nlohmann::ordered_json j = {{"path", c.path},
                              {"status", c.status()},
                              {"exact", c.exact},
                              {"compared", c.compared},
                              {"numel", c.numel},
                              {"mismatches", c.mismatches},
                              {"max_abs", number(c.max_abs)},
                              {"mean_abs", number(c.mean_abs)},
                              {"baseline_max_abs", optional_number(c.baseline_max_abs)},
                              {"baseline_mean_abs", optional_number(c.baseline_mean_abs)},
                              {"statistic", c.statistic()},
                              {"limit", number(c.limit)},
                              {"floor", optional_number(c.floor)},
                              {"error_to_limit", optional_number(c.error_to_limit)},
                              {"floor_use", optional_number(c.floor_use)},
                              {"baseline_floor_use", optional_number(c.baseline_floor_use)},
                              {"note", c.note},
                              {"rel_fro", optional_number(c.rel_fro)},
                              {"cosine", optional_number(c.cosine)}};
  if (c.worst) {
    const auto& w = *c.worst;
    j["worst"] = {{"index", w.index},
                  {"prod", number(w.prod)},
                  {"ref", number(w.ref)},
                  {"ref_fp64", optional_number(w.ref_fp64)},
                  {"base", optional_number(w.base)},
                  {"detail", w.detail}};
  } else {
    j["worst"] = nullptr;
  }
  j["message"] =
      c.failure.empty() ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(c.failure);
  return j;
}

nlohmann::ordered_json metrics_json(const std::vector<std::pair<std::string, double>>& metrics) {
  nlohmann::ordered_json out = nlohmann::ordered_json::object();
  for (const auto& [name, value] : metrics) out[name] = value;
  return out;
}

nlohmann::ordered_json loss_curve_json(const std::optional<LossCurve>& curve) {
  if (!curve) return nullptr;
  std::vector<int64_t> steps(curve->prod.size());
  for (size_t i = 0; i < steps.size(); ++i) steps[i] = static_cast<int64_t>(i);
  return {
      {"steps", steps},
      {"prod", curve->prod},
      {"base", curve->base},
      {"ref", curve->ref},
      {"grad_norm",
       {{"prod", curve->grad_norm_prod},
        {"base", curve->grad_norm_base},
        {"ref", curve->grad_norm_ref}}},
      {"divergence_step", curve->divergence_step ? nlohmann::ordered_json(*curve->divergence_step)
                                                 : nlohmann::ordered_json(nullptr)}};
}

}  // namespace

nlohmann::ordered_json to_json(const RunReport& report) {
  const auto& env = report.environment;
  nlohmann::ordered_json j = {
      {"tool", report.tool},
      {"version", report.version},
      {"environment",
       {{"device", env.device},
        {"gpu", env.gpu ? nlohmann::ordered_json(*env.gpu) : nlohmann::ordered_json(nullptr)},
        {"torch", env.torch},
        {"cuda", env.cuda ? nlohmann::ordered_json(*env.cuda) : nlohmann::ordered_json(nullptr)},
        {"compiler", env.compiler}}},
      {"implementation",
       {{"namespace", report.implementation.ns},
        {"schema_version", report.implementation.schema_version},
        {"libraries", report.implementation.libraries}}}};
  nlohmann::ordered_json cases = nlohmann::ordered_json::array();
  for (const auto& c : report.cases) {
    nlohmann::ordered_json checks = nlohmann::ordered_json::array();
    for (const auto& check : c.checks) checks.push_back(check_json(check));
    cases.push_back({{"id", c.id},
                     {"kind", c.kind},
                     {"status", c.status()},
                     {"source", c.source},
                     {"spec", spec_json(c.spec)},
                     {"checks", checks},
                     {"metrics", metrics_json(c.metrics)},
                     {"loss_curve", loss_curve_json(c.loss_curve)},
                     {"input_error", c.input_error.empty() ? nlohmann::ordered_json(nullptr)
                                                           : nlohmann::ordered_json(c.input_error)},
                     {"unsupported", c.unsupported.empty() ? nlohmann::ordered_json(nullptr)
                                                           : nlohmann::ordered_json(c.unsupported)},
                     {"replay", c.replay}});
  }
  j["cases"] = cases;
  j["summary"] = {{"total", report.cases.size()},
                  {"passed", report.passed()},
                  {"failed", report.failed()},
                  {"invalid", report.invalid()},
                  {"unsupported", report.unsupported()}};
  return j;
}

}  // namespace gradscope::report

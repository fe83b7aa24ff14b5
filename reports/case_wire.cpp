#include "reports/case_wire.h"

#include <nlohmann/json.hpp>

namespace gradscope::report {
namespace {

using nlohmann::json;

template <typename T>
json opt(const std::optional<T>& v) {
  return v ? json(*v) : json(nullptr);
}

template <typename T>
std::optional<T> opt_from(const json& j) {
  if (j.is_null()) return std::nullopt;
  return j.get<T>();
}

json spec_to(const SpecFields& spec) {
  json out = json::array();
  for (const auto& [name, value] : spec) {
    json v;
    std::visit([&](const auto& x) { v = x; }, value);
    out.push_back({{"name", name}, {"index", value.index()}, {"value", v}});
  }
  return out;
}

SpecFields spec_from(const json& j) {
  SpecFields out;
  for (const auto& f : j) {
    SpecValue v;
    switch (f.at("index").get<size_t>()) {
      case 0:
        v = f.at("value").get<int64_t>();
        break;
      case 1:
        v = f.at("value").get<double>();
        break;
      case 2:
        v = f.at("value").get<bool>();
        break;
      default:
        v = f.at("value").get<std::string>();
    }
    out.emplace_back(f.at("name").get<std::string>(), std::move(v));
  }
  return out;
}

json check_to(const Check& c) {
  json w = nullptr;
  if (c.worst) {
    w = {{"index", c.worst->index},    {"prod", c.worst->prod},
         {"ref", c.worst->ref},        {"ref_fp64", opt(c.worst->ref_fp64)},
         {"base", opt(c.worst->base)}, {"detail", c.worst->detail}};
  }
  return {{"path", c.path},
          {"passed", c.passed},
          {"out_of_range", c.out_of_range},
          {"exact", c.exact},
          {"compared", c.compared},
          {"numel", c.numel},
          {"mismatches", c.mismatches},
          {"max_abs", c.max_abs},
          {"mean_abs", c.mean_abs},
          {"baseline_max_abs", opt(c.baseline_max_abs)},
          {"baseline_mean_abs", opt(c.baseline_mean_abs)},
          {"gate_on_mean", c.gate_on_mean},
          {"limit", c.limit},
          {"floor", opt(c.floor)},
          {"error_to_limit", opt(c.error_to_limit)},
          {"floor_use", opt(c.floor_use)},
          {"baseline_floor_use", opt(c.baseline_floor_use)},
          {"note", c.note},
          {"rel_fro", opt(c.rel_fro)},
          {"cosine", opt(c.cosine)},
          {"worst", w},
          {"failure", c.failure},
          {"error_histogram", c.error_histogram}};
}

Check check_from(const json& j) {
  Check c;
  c.path = j.at("path").get<std::string>();
  c.passed = j.at("passed").get<bool>();
  c.out_of_range = j.at("out_of_range").get<bool>();
  c.exact = j.at("exact").get<bool>();
  c.compared = j.at("compared").get<std::string>();
  c.numel = j.at("numel").get<int64_t>();
  c.mismatches = j.at("mismatches").get<int64_t>();
  c.max_abs = j.at("max_abs").get<double>();
  c.mean_abs = j.at("mean_abs").get<double>();
  c.baseline_max_abs = opt_from<double>(j.at("baseline_max_abs"));
  c.baseline_mean_abs = opt_from<double>(j.at("baseline_mean_abs"));
  c.gate_on_mean = j.at("gate_on_mean").get<bool>();
  c.limit = j.at("limit").get<double>();
  c.floor = opt_from<double>(j.at("floor"));
  c.error_to_limit = opt_from<double>(j.at("error_to_limit"));
  c.floor_use = opt_from<double>(j.at("floor_use"));
  c.baseline_floor_use = opt_from<double>(j.at("baseline_floor_use"));
  c.note = j.at("note").get<std::string>();
  c.rel_fro = opt_from<double>(j.at("rel_fro"));
  c.cosine = opt_from<double>(j.at("cosine"));
  if (const auto& w = j.at("worst"); !w.is_null()) {
    WorstElement e;
    e.index = w.at("index").get<std::vector<int64_t>>();
    e.prod = w.at("prod").get<double>();
    e.ref = w.at("ref").get<double>();
    e.ref_fp64 = opt_from<double>(w.at("ref_fp64"));
    e.base = opt_from<double>(w.at("base"));
    e.detail = w.at("detail").get<std::string>();
    c.worst = std::move(e);
  }
  c.failure = j.at("failure").get<std::string>();
  c.error_histogram = j.at("error_histogram").get<std::vector<int64_t>>();
  return c;
}

json checks_to(const std::vector<Check>& checks) {
  json out = json::array();
  for (const auto& c : checks) out.push_back(check_to(c));
  return out;
}

std::vector<Check> checks_from(const json& j) {
  std::vector<Check> out;
  for (const auto& c : j) out.push_back(check_from(c));
  return out;
}

json curve_to(const LossCurve& l) {
  return {{"prod", l.prod},
          {"base", l.base},
          {"ref", l.ref},
          {"grad_norm_prod", l.grad_norm_prod},
          {"grad_norm_base", l.grad_norm_base},
          {"grad_norm_ref", l.grad_norm_ref},
          {"divergence_step", opt(l.divergence_step)}};
}

LossCurve curve_from(const json& j) {
  LossCurve l;
  l.prod = j.at("prod").get<std::vector<double>>();
  l.base = j.at("base").get<std::vector<double>>();
  l.ref = j.at("ref").get<std::vector<double>>();
  l.grad_norm_prod = j.at("grad_norm_prod").get<std::vector<double>>();
  l.grad_norm_base = j.at("grad_norm_base").get<std::vector<double>>();
  l.grad_norm_ref = j.at("grad_norm_ref").get<std::vector<double>>();
  l.divergence_step = opt_from<int64_t>(j.at("divergence_step"));
  return l;
}

std::string to_bytes(const json& j) {
  const auto cbor = json::to_cbor(j);
  return std::string(cbor.begin(), cbor.end());
}

json from_bytes(const std::string& bytes) {
  return json::from_cbor(std::vector<uint8_t>(bytes.begin(), bytes.end()));
}

}  // namespace

std::string checks_to_wire(const std::vector<Check>& checks) {
  return to_bytes(checks_to(checks));
}

std::vector<Check> checks_from_wire(const std::string& bytes) {
  return checks_from(from_bytes(bytes));
}

std::string cases_to_wire(const std::vector<CaseResult>& cases) {
  json out = json::array();
  for (const auto& c : cases) {
    out.push_back({{"id", c.id},
                   {"kind", c.kind},
                   {"source", c.source},
                   {"spec", spec_to(c.spec)},
                   {"spec_toml", c.spec_toml},
                   {"checks", checks_to(c.checks)},
                   {"replay", c.replay},
                   {"metrics", c.metrics},
                   {"loss_curve", c.loss_curve ? curve_to(*c.loss_curve) : json(nullptr)},
                   {"seconds", c.seconds},
                   {"input_error", c.input_error},
                   {"unsupported", c.unsupported}});
  }
  return to_bytes(out);
}

std::vector<CaseResult> cases_from_wire(const std::string& bytes) {
  std::vector<CaseResult> out;
  for (const auto& j : from_bytes(bytes)) {
    CaseResult c;
    c.id = j.at("id").get<std::string>();
    c.kind = j.at("kind").get<std::string>();
    c.source = j.at("source").get<std::string>();
    c.spec = spec_from(j.at("spec"));
    c.spec_toml = j.at("spec_toml").get<std::string>();
    c.checks = checks_from(j.at("checks"));
    c.replay = j.at("replay").get<std::string>();
    c.metrics = j.at("metrics").get<std::vector<std::pair<std::string, double>>>();
    if (!j.at("loss_curve").is_null()) c.loss_curve = curve_from(j.at("loss_curve"));
    c.seconds = j.at("seconds").get<double>();
    c.input_error = j.at("input_error").get<std::string>();
    c.unsupported = j.at("unsupported").get<std::string>();
    out.push_back(std::move(c));
  }
  return out;
}

}  // namespace gradscope::report

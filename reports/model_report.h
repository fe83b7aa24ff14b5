// check_model's report (python -m gradscope model, docs/python.md): every module of a model as
// judged, in the model's order, and its writers: JSON, JUnit XML and an HTML heatmap of
// err/limit. The Python package hands the report over through the binding; the figures are
// its checks' own, never recomputed here.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace gradscope::report {

struct ModelCheck {
  std::string name;       // the module's own path of the tensor (lora_A.default.weight.grad)
  std::string status;     // pass, fail, out_of_range
  std::string statistic;  // what `value` is: max_abs, mean_abs, frobenius, abs
  std::optional<double> value, limit;
  std::string message;
  bool passed() const { return status == "pass"; }
  bool judged() const { return status != "out_of_range"; }
  // value / limit where both exist and limit > 0.
  std::optional<double> ratio() const;
};

struct ModelCase {
  std::string id;      // its second dot-separated part is the dtype
  std::string status;  // pass, fail, invalid, unsupported
  std::string replay;
  std::string unsupported;  // the module's message when it declined
  std::vector<ModelCheck> checks;
  std::string dtype() const;
};

struct ModelModule {
  std::string path;  // model.layers.3.mlp, or end_to_end
  std::string kind;  // lora_w, qkv, mlp, layer, model
  bool passed = true;
  bool not_judged = false;  // a dtype whose checks could not be judged
  std::vector<ModelCase> cases;
  // FAIL, invalid or pass.
  std::string verdict() const { return !passed ? "FAIL" : not_judged ? "invalid" : "pass"; }
};

struct ModelReport {
  std::vector<ModelModule> modules;
  std::string note;  // why end to end did not run, where it did not
  bool passed() const;
  const ModelModule* first_failure() const;
};

std::string model_json(const ModelReport& report);
// A testcase per module (classname), dtype and tensor; a failing check's message as its failure.
std::string model_junit(const ModelReport& report, const std::string& name);
// Modules down; per dtype the worst err/limit of each tensor role (output, input.grad, lora_A,
// lora_B, losses, errors), white at 0 through orange towards 1, failing cells red.
std::string model_html(const ModelReport& report, const std::string& title);

}  // namespace gradscope::report

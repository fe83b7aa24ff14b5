#include <algorithm>

#include "harness/catalog/runner_registry.h"
#include "harness/runners/runner_factories.h"
#include "harness/spec/case_runner.h"

namespace gradscope {
namespace {

const std::vector<std::unique_ptr<CaseRunner>>& registry() {
  static const auto runners = [] {
    std::vector<std::unique_ptr<CaseRunner>> r;
    r.push_back(make_dequant_runner());
    r.push_back(make_lora_w_runner());
    r.push_back(make_qkv_runner());
    r.push_back(make_mlp_runner());
    r.push_back(make_layer_runner());
    r.push_back(make_training_runner());
    r.push_back(make_fsdp_runner());
    return r;
  }();
  return runners;
}

}  // namespace

const CaseRunner* find_runner(const std::string& kind) {
  const auto& r = registry();
  auto it = std::find_if(r.begin(), r.end(), [&](const auto& p) { return p->kind() == kind; });
  return it == r.end() ? nullptr : it->get();
}

std::vector<std::string> runner_kinds() {
  std::vector<std::string> kinds;
  for (const auto& r : registry()) kinds.push_back(r->kind());
  return kinds;
}

}  // namespace gradscope

#include "harness/catalog/kind_registry.h"

#include <algorithm>

#include "harness/kinds/kind_decls.h"

namespace gradscope {
namespace {

const std::vector<CaseKind>& registry() {
  static const std::vector<CaseKind> kinds = [] {
    std::vector<CaseKind> k;
    for (auto decl :
         {dequant_kind, lora_w_kind, qkv_kind, mlp_kind, layer_kind, training_kind, fsdp_kind}) {
      k.emplace_back(decl());
    }
    return k;
  }();
  return kinds;
}

}  // namespace

const CaseKind* find_kind(const std::string& name) {
  const auto& r = registry();
  auto it = std::find_if(r.begin(), r.end(), [&](const CaseKind& k) { return k.name() == name; });
  return it == r.end() ? nullptr : &*it;
}

std::vector<std::string> kind_names() {
  std::vector<std::string> names;
  for (const auto& k : registry()) names.push_back(k.name());
  return names;
}

}  // namespace gradscope

// The kinds gradscope runs: one declaration each (kinds/), listed in kind_registry.cpp.
#pragma once

#include <string>
#include <vector>

#include "harness/engine/case_kind.h"

namespace gradscope {

// nullptr for an unknown kind.
const CaseKind* find_kind(const std::string& name);
std::vector<std::string> kind_names();

}  // namespace gradscope

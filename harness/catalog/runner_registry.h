// The kinds gradscope runs: one runner each (runners/), listed in runner_registry.cpp.
#pragma once

#include <string>
#include <vector>

#include "harness/spec/case_runner.h"

namespace gradscope {

// nullptr for an unknown kind.
const CaseRunner* find_runner(const std::string& kind);
std::vector<std::string> runner_kinds();

}  // namespace gradscope

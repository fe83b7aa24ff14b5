// Which cases a command runs: case files, a suite folder or a checkpoint's layers, with the
// overrides (--device, --dtype, --seed) applied and the id filter matched. Errors are
// InputErrors (exit 2).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "harness/cli/checkpoint_commands.h"
#include "harness/spec/case_spec.h"

namespace gradscope {

struct CaseSelection {
  std::vector<std::string> files;
  std::string suite;
  std::vector<std::string> filters;  // --filter globs: a case is selected when one matches
  std::string cases_dir;
  std::string device, dtype;
  int64_t seed = -1;
  CheckpointSelection checkpoint;
};

struct SelectedCase {
  CaseSpec spec;
  std::string id;
  // A case drawn by `gradscope sample` without --cases-out has no file: the command that
  // writes the draw's files first, and this case's file among them, for its replay line.
  std::string replay_setup, replay_file;
};

// The selected cases in file order, each id once (an override can make two cases identical).
std::vector<SelectedCase> select_cases(const CaseSelection& sel);

}  // namespace gradscope

#include "harness/cli/case_selection.h"

#include <fnmatch.h>

#include <cstdlib>
#include <set>

#include "harness/catalog/case_file.h"
#include "harness/catalog/kind_registry.h"
#include "harness/common/file_system.h"
#include "harness/common/input_error.h"

#ifndef GRADSCOPE_DEFAULT_CASES_DIR
#define GRADSCOPE_DEFAULT_CASES_DIR "cases"
#endif

namespace gradscope {
namespace {

std::string cases_dir(const CaseSelection& sel) {
  if (!sel.cases_dir.empty()) return sel.cases_dir;
  if (const char* env = std::getenv("GRADSCOPE_CASES_DIR")) return env;
  return GRADSCOPE_DEFAULT_CASES_DIR;
}

std::vector<std::string> suite_files(const std::string& dir, const std::string& suite) {
  const std::string folder = dir + "/" + suite;
  if (suite.empty() || suite.find("..") != std::string::npos || !files::is_directory(folder)) {
    std::string available;
    for (const auto& n : files::subdirectories(dir))
      available += (available.empty() ? "" : ", ") + n;
    throw InputError("unknown suite '" + suite + "' (no folder " + folder +
                     "); available suites: " + (available.empty() ? "none" : available));
  }
  auto found = files::find_files(folder, ".toml");
  if (found.empty()) {
    throw InputError("suite '" + suite + "' (" + folder + ") holds no .toml case files");
  }
  return found;
}

// The cases one command may select (each file holds at most 100000): the specs are kept in
// memory, and a run of more would not finish anyway.
constexpr size_t kMaxCasesPerRun = 1000000;
}  // namespace

std::vector<SelectedCase> select_cases(const CaseSelection& sel) {
  std::vector<std::string> files = sel.files;
  std::vector<CaseSpec> specs;
  if (!sel.checkpoint.dir.empty()) {
    if (!files.empty() || !sel.suite.empty()) {
      throw InputError("--checkpoint selects its own cases: give no case files or --suite");
    }
    specs = checkpoint_cases(sel.checkpoint);
  } else if (!sel.suite.empty() || files.empty()) {
    const auto more = suite_files(cases_dir(sel), sel.suite.empty() ? "smoke" : sel.suite);
    files.insert(files.end(), more.begin(), more.end());
  }
  std::vector<SelectedCase> selected;
  std::set<std::string> seen;
  for (const auto& file : files) {
    for (auto& spec : load_case_file(file)) specs.push_back(std::move(spec));
    if (specs.size() > kMaxCasesPerRun) {
      throw InputError(file + ": the selection expands to more than " +
                       std::to_string(kMaxCasesPerRun) + " cases; select fewer files");
    }
  }
  for (auto& spec : specs) {
    if (!sel.device.empty()) override_field(spec, "device", sel.device, "--device");
    if (!sel.dtype.empty()) override_field(spec, "dtype", sel.dtype, "--dtype");
    if (sel.seed >= 0) override_field(spec, "seed", std::to_string(sel.seed), "--seed");
    std::string id = find_kind(spec.kind)->case_id(spec);
    if (!sel.filters.empty() &&
        std::none_of(sel.filters.begin(), sel.filters.end(), [&](const std::string& glob) {
          return fnmatch(glob.c_str(), id.c_str(), 0) == 0;
        })) {
      continue;
    }
    if (!seen.insert(id).second) continue;  // an override can make two cases identical
    selected.push_back({std::move(spec), std::move(id), "", ""});
  }
  if (selected.empty()) {
    std::string globs;
    for (const auto& glob : sel.filters) globs += (globs.empty() ? "'" : " or '") + glob + "'";
    throw InputError(sel.filters.empty() ? "no cases selected"
                                         : "no case id matches --filter " + globs);
  }
  return selected;
}

}  // namespace gradscope

// A fuzzing process's one scratch path, under $TMPDIR (else /tmp), named for the target and the
// process, and removed when the process exits (libFuzzer returns from main after its runs): a
// CI run leaves nothing in the temporary folder. A process that stops on a finding keeps it.
#pragma once

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>

namespace gradscope::fuzzing {

inline std::string scratch_path(const std::string& target, const std::string& suffix = "") {
  static std::string path;  // one per process: every target asks once
  const char* tmp = std::getenv("TMPDIR");
  path = std::string(tmp && *tmp ? tmp : "/tmp") + "/gradscope-fuzz-" + target + "-" +
         std::to_string(::getpid()) + suffix;
  std::atexit([] {
    std::error_code ignored;
    std::filesystem::remove_all(path, ignored);
  });
  return path;
}

}  // namespace gradscope::fuzzing

// Runs the CLI in-process and captures what it prints.
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "harness/cli/cli.h"

namespace gradscope::testing {

struct CliResult {
  int code;
  std::string out, err;
};

inline CliResult run_captured(const std::vector<std::string>& args) {
  ::testing::internal::CaptureStdout();
  ::testing::internal::CaptureStderr();
  const int code = run_cli(args);
  return {code, ::testing::internal::GetCapturedStdout(), ::testing::internal::GetCapturedStderr()};
}

}  // namespace gradscope::testing

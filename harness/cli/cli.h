// The gradscope command line. Exit codes: 0 every check passed, 1 a check
// failed, 2 bad usage or bad input.
#pragma once

#include <functional>
#include <string>
#include <vector>

namespace gradscope {

// Who runs the command line: the program a replay line starts with, and whether it is the
// Python package, which imports --import's modules itself before calling in.
struct CliHost {
  std::string program = "gradscope";
  bool imports_modules = false;
  // Polled between cases and phases of run and sample; throws RunInterrupted
  // (harness/engine/case_kind.h) to stop the run (the Python package's Ctrl-C).
  std::function<void()> poll;
};

int run_cli(int argc, const char* const* argv);
// args without the program name (tests, the Python package).
int run_cli(const std::vector<std::string>& args, const CliHost& host = {});

}  // namespace gradscope

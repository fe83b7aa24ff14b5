// The gradscope command line. Exit codes: 0 every check passed, 1 a check
// failed, 2 bad usage or bad input.
#pragma once

#include <string>
#include <vector>

namespace gradscope {

int run_cli(int argc, const char* const* argv);
// Convenience for tests: args without the program name.
int run_cli(const std::vector<std::string>& args);

}  // namespace gradscope

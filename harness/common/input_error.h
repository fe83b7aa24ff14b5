// Bad input (case file, CLI argument, data file): reported with what was
// expected, and the process exits 2.
#pragma once

#include <stdexcept>

namespace gradscope {

struct InputError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

}  // namespace gradscope

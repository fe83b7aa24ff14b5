// The message of the error a call throws, for tests that check what it says.
#pragma once

#include <c10/util/Exception.h>

#include <functional>
#include <string>

#include "harness/common/input_error.h"

namespace gradscope::testing {

// What a TORCH_CHECK in the call said, without the backtrace; "(no error)" if it returned.
inline std::string torch_error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const c10::Error& e) {
    return e.what_without_backtrace();
  }
  return "(no error)";
}

// What an InputError (bad input, exit 2) from the call said; "(no error)" if it returned.
inline std::string input_error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const InputError& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace gradscope::testing

// toml++, as every gradscope file includes it (never <toml++/toml.h> directly, so that each
// translation unit expands its inline functions alike).
//
// toml++ 3.3.0 states its internal preconditions with TOML_ASSERT_ASSUME: an assert, or under
// NDEBUG an optimizer assumption (clang's __builtin_assume). Not all hold on malformed text:
// a table header such as "[<" or "[&" reaches the key parser with a character it assumes
// cannot be there (toml++ issue #294; found here by the case-file fuzzer), which aborts an
// assert build and is undefined behaviour in a clang release build. Here each such
// precondition is a run-time test in every build that throws TomlPreconditionFailed, which
// the case-file loader reports as malformed TOML (docs/case-files.md).
#pragma once

#include <stdexcept>
#include <string>

namespace gradscope {

struct TomlPreconditionFailed : std::runtime_error {
  using std::runtime_error::runtime_error;
};

[[noreturn]] inline void toml_precondition_failed(const char* condition) {
  throw TomlPreconditionFailed(condition);
}

}  // namespace gradscope

#pragma push_macro("NDEBUG")
#undef NDEBUG
#define TOML_ASSERT(expr) \
  ((expr) ? static_cast<void>(0) : ::gradscope::toml_precondition_failed(#expr))
#include <toml++/toml.h>
#pragma pop_macro("NDEBUG")

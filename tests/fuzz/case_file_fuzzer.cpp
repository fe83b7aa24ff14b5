// libFuzzer target: case-file text through the loader. Bad text must end in an
// InputError (exit 2 with a message); any other exception or a crash is a finding.
// A case that loads must survive its own round trip through to_toml().
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string_view>

#include "harness/catalog/case_file.h"
#include "harness/common/input_error.h"
#include "harness/spec/case_spec.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  std::vector<gradscope::CaseSpec> cases;
  try {
    cases = gradscope::parse_case_text(text, "fuzz.toml");
  } catch (const gradscope::InputError&) {
    return 0;
  }
  for (const auto& c : cases) {
    const std::string toml = c.to_toml();
    try {
      const auto again = gradscope::parse_case_text(toml, "roundtrip.toml");
      if (again.size() != 1 || again[0].to_toml() != toml) {
        std::fprintf(stderr, "round trip changed the case:\n%s\n", toml.c_str());
        std::abort();
      }
    } catch (const gradscope::InputError& e) {
      std::fprintf(stderr, "a loaded case does not reload: %s\n%s\n", e.what(), toml.c_str());
      std::abort();
    }
  }
  return 0;
}

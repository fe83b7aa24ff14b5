// libFuzzer target: bytes as the accepted JSON report of `run --against`. A file that is not
// a gradscope report of numbers (or "inf"/"nan" strings) must end in an InputError; any other
// exception or a crash is a finding.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <sstream>
#include <string>

#include "fuzz_scratch.h"
#include "harness/common/input_error.h"
#include "harness/verdict/regression_gate.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // The gate reads a file: one scratch file per process, rewritten per input.
  static const std::string path = gradscope::fuzzing::scratch_path("against", ".json");
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) return 0;
  std::fwrite(data, 1, size, f);
  std::fclose(f);
  // A current run with one check, so that both sides of the comparison are exercised.
  gradscope::report::RunReport current;
  gradscope::report::CaseResult c;
  c.id = "case";
  gradscope::report::Check check;
  check.path = "case/x";
  check.max_abs = 1.0;
  check.baseline_max_abs = 2.0;
  c.checks.push_back(check);
  current.cases.push_back(c);
  try {
    std::ostringstream out;
    gradscope::compare_with_accepted(out, current, path, 1.25);
  } catch (const gradscope::InputError&) {
  }
  return 0;
}

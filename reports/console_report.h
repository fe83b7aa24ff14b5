// The console table printed by `gradscope run`.
#pragma once

#include <ostream>

#include "reports/report_types.h"

namespace gradscope::report {

struct ConsoleOptions {
  bool quiet = false;  // only failures and the summary
};

// One case as it finishes: a status line, and for a failing case each failing
// check's message.
void print_case(std::ostream& out, const CaseResult& result, const ConsoleOptions& options);
// The closing lines: per-kind counts, then `N passed, M failed`.
void print_summary(std::ostream& out, const RunReport& report);

}  // namespace gradscope::report

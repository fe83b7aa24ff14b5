// `gradscope run ... --against ACCEPTED.json`: a kernel change can keep passing the
// ratio rule while getting worse. Every check is scored (err(prod)/err(base) under the
// ratio rule, max_abs for exact checks) and compared with an accepted report.
#pragma once

#include <ostream>
#include <string>

#include "reports/report_types.h"

namespace gradscope {

// Flags checks whose score grew by more than `factor`, and checks that are new or
// missing; prints them old beside new and returns how many were flagged. Throws
// InputError if `accepted_path` is not a readable gradscope JSON report.
int64_t compare_with_accepted(std::ostream& out, const report::RunReport& current,
                              const std::string& accepted_path, double factor);

}  // namespace gradscope

// One selected case run through its kind's engine, and what came of it: its checks, an input
// error (the case cannot be judged: exit 2), a case the implementation declined, or an error
// prod raised (a failing check). The replay line that reruns it alone.
#pragma once

#include <string>

#include "harness/cli/case_selection.h"
#include "harness/engine/case_kind.h"
#include "reports/report_types.h"

namespace gradscope {

// `program` is the command the replay line starts with.
report::CaseResult run_case(const SelectedCase& sc, const std::string& program,
                            const RunOptions& options);

}  // namespace gradscope

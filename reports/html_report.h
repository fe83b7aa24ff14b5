// `gradscope run --html FILE`: one self-contained page (no scripts, no network) with
// the summary, a table per case, and plots drawn as inline SVG.
#pragma once

#include <string>

#include "reports/report_types.h"

namespace gradscope::report {

std::string to_html(const RunReport& report);

}  // namespace gradscope::report

// The machine-readable report (`gradscope run --json FILE`).
#pragma once

#include <nlohmann/json.hpp>

#include "reports/report_types.h"

namespace gradscope::report {

nlohmann::ordered_json to_json(const RunReport& report);

}  // namespace gradscope::report

// JUnit XML (`gradscope run --junit FILE`): one testcase per check, classname = case id,
// name = the tensor path below it; a failing check carries a <failure> with its message.
#pragma once

#include <string>

#include "reports/report_types.h"

namespace gradscope::report {

std::string to_junit_xml(const RunReport& report);

}  // namespace gradscope::report

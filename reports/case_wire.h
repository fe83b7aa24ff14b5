// Case results between processes: what a rank sends to rank 0, which writes the reports
// (docs/distributed.md). CBOR through nlohmann-json: doubles travel bit for bit, inf and NaN
// included. Dumped tensors and inputs do not travel (a run spread over ranks takes no --dump).
#pragma once

#include <string>
#include <vector>

#include "reports/report_types.h"

namespace gradscope::report {

std::string checks_to_wire(const std::vector<Check>& checks);
std::vector<Check> checks_from_wire(const std::string& bytes);

std::string cases_to_wire(const std::vector<CaseResult>& cases);
std::vector<CaseResult> cases_from_wire(const std::string& bytes);

}  // namespace gradscope::report

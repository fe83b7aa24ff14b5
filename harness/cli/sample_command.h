// `gradscope sample`: valid cases drawn over the whole case space, run on correct kernels; a
// failing check there is a false alarm (docs/verification.md).
#pragma once

#include <string>

#include "harness/catalog/case_sampler.h"
#include "harness/cli/run_command.h"

namespace gradscope {

struct SampleCommand {
  SampleOptions draw;
  std::string cases_out;   // folder for the drawn case files
  bool draw_only = false;  // write the case files and run none
  double max_seconds = 0;
};

// Exit 1 on a false alarm; cases the formats cannot hold are counted as invalid and listed.
int command_sample(const SampleCommand& cmd, const ReportOptions& o, const std::string& program);

}  // namespace gradscope

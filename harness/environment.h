// What the report says about where it ran.
#pragma once

#include "reports/report_types.h"

namespace gradscope {

// True when this build has the CUDA kernels and torch sees a GPU.
bool cuda_usable();
report::Environment probe_environment(const std::string& device);

}  // namespace gradscope

// What the report says about where it ran.
#pragma once

#include "reports/report_types.h"

namespace gradscope {

// True when this build has the CUDA kernels and torch sees a GPU.
bool cuda_usable();
report::Environment probe_environment(const std::string& device);
// Makes CUDA runs repeatable bit for bit: CUBLAS_WORKSPACE_CONFIG=:4096:8 (unless the user
// set it; cuBLAS reads it when its first handle is made) and ATen's deterministic
// algorithms (warning, not failing, where an op has none). Not cuDNN attention's backward,
// which keeps its non-deterministic algorithm while these only warn (CHANGELOG, known
// issues). Call before any CUDA work.
void make_cuda_deterministic();
// Under torchrun, one GPU per process: GPU `local_rank` becomes the current device, on which
// the process's cases run. Throws InputError when the machine has fewer GPUs.
void use_gpu_of_local_rank(int local_rank);

}  // namespace gradscope

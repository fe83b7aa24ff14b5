// What the report says about where it ran.
#pragma once

#include "reports/report_types.h"

namespace gradscope {

// True when this build has the CUDA kernels and torch sees a GPU.
bool cuda_usable();
report::Environment probe_environment(const std::string& device);
// For its lifetime, CUDA runs repeatable bit for bit: CUBLAS_WORKSPACE_CONFIG=:4096:8 (unless
// the user set it; cuBLAS reads it when its first handle is made, so it stays) and ATen's
// deterministic algorithms, restored to what they were afterwards (a Python process that
// runs a check goes on with its own setting). `strict` (gradscope's own kernels under test,
// nothing loaded beside them): an op without a deterministic variant throws, and SDPA leaves
// out cuDNN attention, whose backward is non-deterministic. Not strict (another
// implementation under test): such ops run with torch's warning, so that its kernels are
// judged rather than refused, and the layer kinds' attention may differ in the last digits
// between runs (docs/gpu-machine.md). Make it before any CUDA work.
class CudaDeterminism {
 public:
  explicit CudaDeterminism(bool strict);
  ~CudaDeterminism();
  CudaDeterminism(const CudaDeterminism&) = delete;
  CudaDeterminism& operator=(const CudaDeterminism&) = delete;

 private:
  bool was_on_, was_warn_only_;
};
// Under torchrun, one GPU per process: GPU `local_rank` becomes the current device, on which
// the process's cases run. Throws InputError when the machine has fewer GPUs.
void use_gpu_of_local_rank(int local_rank);

}  // namespace gradscope

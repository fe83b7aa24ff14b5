#include "harness/cli/environment.h"

#include <ATen/Context.h>

#include <torch/version.h>
#include <cstdlib>
#include <string>

#include "gradscope/dequant.h"
#include "harness/common/input_error.h"

#ifdef GRADSCOPE_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAFunctions.h>
#include <cuda_runtime_api.h>
#endif

#ifndef GRADSCOPE_COMMIT
#define GRADSCOPE_COMMIT "unknown"
#endif

namespace gradscope {

bool cuda_usable() {
  return built_with_cuda() && at::hasCUDA();
}

report::Environment probe_environment(const std::string& device) {
  report::Environment env;
  env.device = device;
  env.torch = TORCH_VERSION;
  env.commit = GRADSCOPE_COMMIT;
  env.compiler = "g++ " __VERSION__;
#ifdef GRADSCOPE_WITH_CUDA
  if (cuda_usable()) {
    env.gpu = at::cuda::getCurrentDeviceProperties()->name;
    int runtime = 0;
    cudaRuntimeGetVersion(&runtime);
    env.cuda = std::to_string(runtime / 1000) + "." + std::to_string(runtime % 1000 / 10);
  }
#endif
  return env;
}

void use_gpu_of_local_rank(int local_rank) {
#ifdef GRADSCOPE_WITH_CUDA
  const int count = c10::cuda::device_count();
  if (local_rank >= count) {
    throw InputError("LOCAL_RANK=" + std::to_string(local_rank) + ": this machine has " +
                     std::to_string(count) +
                     " GPU(s), one per process is needed (--nproc-per-node at most " +
                     std::to_string(count) + ")");
  }
  c10::cuda::set_device(static_cast<c10::DeviceIndex>(local_rank));
#else
  (void)local_rank;
#endif
}

CudaDeterminism::CudaDeterminism(bool strict)
    : was_on_(at::globalContext().deterministicAlgorithms()),
      was_warn_only_(at::globalContext().deterministicAlgorithmsWarnOnly()) {
  setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8", /*overwrite=*/0);
  at::globalContext().setDeterministicAlgorithms(true, /*warn_only=*/!strict);
}

CudaDeterminism::~CudaDeterminism() {
  at::globalContext().setDeterministicAlgorithms(was_on_, was_warn_only_);
}

}  // namespace gradscope

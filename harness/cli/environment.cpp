#include "harness/cli/environment.h"

#include <ATen/Context.h>

#include <torch/version.h>
#include <cstdlib>

#include "gradscope/dequant.h"

#ifdef GRADSCOPE_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
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

void make_cuda_deterministic() {
  setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8", /*overwrite=*/0);
  at::globalContext().setDeterministicAlgorithms(true, /*warn_only=*/true);
}

}  // namespace gradscope

// gradscope_adapter_bench: each kernel of the fp32 adapter path (kernels/src/
// lora_adapter_cuda.cu) timed alone through its launch interface, at a Llama-2-70B projection
// (8192 tokens, 8192 features, fp16) for ranks 8 to 32: x A^T and dY B (one read of the
// half tensor), the low-rank update y += P W with lora_A's and lora_B's layouts (a read and a
// write), and the sums over tokens for dA and dB (one read). CUDA events, 3 warm-ups, median
// of 15; a memset of the half tensor's bytes in the same run is the bound. Exit 2 without a
// GPU. The op-level figures are gradscope_bench's (docs/performance.md).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <vector>

#include "lora_adapter_cuda_launch.h"

namespace {

using namespace gradscope::cuda;

template <typename F>
float median_ms(F launch) {
  cudaEvent_t begin, end;
  cudaEventCreate(&begin);
  cudaEventCreate(&end);
  for (int i = 0; i < 3; ++i) launch();
  std::vector<float> times;
  for (int i = 0; i < 15; ++i) {
    cudaEventRecord(begin);
    launch();
    cudaEventRecord(end);
    cudaEventSynchronize(end);
    float ms = 0;
    cudaEventElapsedTime(&ms, begin, end);
    times.push_back(ms);
  }
  cudaEventDestroy(begin);
  cudaEventDestroy(end);
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

bool check(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return true;
  std::fprintf(stderr, "gradscope_adapter_bench: %s: %s\n", what, cudaGetErrorString(err));
  return false;
}

}  // namespace

int main() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::fprintf(stderr, "gradscope_adapter_bench: needs a CUDA GPU\n");
    return 2;
  }
  constexpr int64_t kTokens = 8192, kFeatures = 8192, kMaxRank = 32;
  void* x = nullptr;
  float *w = nullptr, *p = nullptr, *out = nullptr, *workspace = nullptr;
  const int64_t workspace_floats =
      std::max(rows_times_adapter_workspace(kTokens, kFeatures, kMaxRank),
               outer_product_sum_workspace(kTokens, kFeatures, kMaxRank));
  if (!check(cudaMalloc(&x, kTokens * kFeatures * 2), "cudaMalloc") ||
      !check(cudaMalloc(&w, kMaxRank * kFeatures * 4), "cudaMalloc") ||
      !check(cudaMalloc(&p, kTokens * kMaxRank * 4), "cudaMalloc") ||
      !check(cudaMalloc(&out, std::max(kMaxRank * kFeatures, kTokens * kMaxRank) * 4),
             "cudaMalloc") ||
      !check(cudaMalloc(&workspace, workspace_floats * 4), "cudaMalloc"))
    return 1;
  // Zeros: the values do not change the work.
  cudaMemset(x, 0, kTokens * kFeatures * 2);
  cudaMemset(w, 0, kMaxRank * kFeatures * 4);
  cudaMemset(p, 0, kTokens * kMaxRank * 4);
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);
  std::printf("gradscope_adapter_bench on %s: %lld tokens x %lld features, fp16, median of 15\n",
              prop.name, static_cast<long long>(kTokens), static_cast<long long>(kFeatures));
  const double bytes = kTokens * kFeatures * 2.0;  // the half tensor, once
  const float memset_ms = median_ms([&] { cudaMemsetAsync(x, 0, kTokens * kFeatures * 2); });
  std::printf("memset of the half tensor: %.3f ms, %.2f TB/s\n", memset_ms,
              bytes / memset_ms / 1e9);
  std::printf("%4s %12s %12s %14s %14s %12s %12s   (ms; TB/s of the half tensor's traffic)\n",
              "rank", "x A^T", "dY B", "y += P A", "y += P B^T", "dA sum", "dB sum");
  const AdapterRows rows{x, ElementType::kFloat16, kTokens, kFeatures, nullptr, 1.0f};
  const AdapterMatrix lora_a{w, kFeatures, 1};  // [r, features]
  bool ok = true;
  for (int rank : {8, 16, 32}) {
    const AdapterMatrix lora_b{w, 1, rank};  // [features, r]
    float ms[6];
    ms[0] = median_ms([&] {
      ok &= check(launch_rows_times_adapter({rows, lora_a, rank, 1.0f, out, workspace}, nullptr),
                  "x A^T");
    });
    ms[1] = median_ms([&] {
      ok &= check(launch_rows_times_adapter({rows, lora_b, rank, 1.0f, out, workspace}, nullptr),
                  "dY B");
    });
    for (int i = 0; i < 2; ++i) {
      ms[2 + i] = median_ms([&] {
        ok &= check(launch_add_low_rank({x, ElementType::kFloat16, kTokens, kFeatures, p,
                                         i == 0 ? lora_a : lora_b, rank, nullptr, 1.0f},
                                        nullptr),
                    "low-rank update");
      });
    }
    for (int i = 0; i < 2; ++i) {
      ms[4 + i] = median_ms([&] {
        ok &= check(launch_outer_product_sum({rows, p, rank, 1.0f, out, i == 0 ? kFeatures : 1,
                                              i == 0 ? 1 : rank, workspace},
                                             nullptr),
                    "outer product");
      });
    }
    const double traffic[6] = {bytes, bytes, 2 * bytes, 2 * bytes, bytes, bytes};
    std::printf("%4d", rank);
    for (int i = 0; i < 6; ++i) std::printf(" %6.3f %5.2f", ms[i], traffic[i] / ms[i] / 1e9);
    std::printf("\n");
  }
  return ok && check(cudaDeviceSynchronize(), "kernels") ? 0 : 1;
}

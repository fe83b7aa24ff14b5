#include "harness/engine/judge_device.h"

#include <ATen/ATen.h>

#include <string>
#include <utility>

#ifdef GRADSCOPE_WITH_CUDA
#include <ATen/Context.h>
#include <ATen/Parallel.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <algorithm>
#include <cstring>
#endif

namespace gradscope {

#ifdef GRADSCOPE_WITH_CUDA
namespace {

// n floats from src to dst, host memory both, spread over torch's threads.
void host_copy(float* dst, const float* src, int64_t n) {
  at::parallel_for(0, n, int64_t{1} << 20, [&](int64_t begin, int64_t end) {
    std::memcpy(dst + begin, src + begin, sizeof(float) * static_cast<size_t>(end - begin));
  });
}

// A pinned host buffer of n floats from torch's caching host allocator (kept and reused across
// products), or an undefined tensor where the host cannot pin that much.
at::Tensor pinned_floats(int64_t n) {
  try {
    return at::empty({n}, at::TensorOptions().dtype(at::kFloat).pinned_memory(true));
  } catch (const c10::Error&) {
    return {};
  }
}

// Operands larger than this cross in chunks, each chunk's transfer running while the next is
// copied into pinned memory.
constexpr int64_t kChunkFloats = int64_t{1} << 25;

// x [rows, cols], row-major host floats, on `device`. Pageable memory crosses through the
// driver's own staging at a fraction of the link's rate, pinned memory at the link's
// (docs/performance.md).
at::Tensor to_gpu(const float* x, int64_t rows, int64_t cols, at::Device device) {
  const int64_t n = rows * cols;
  at::Tensor out = at::empty({rows, cols}, at::TensorOptions().dtype(at::kFloat).device(device));
  at::Tensor flat = out.view({-1});
  for (int64_t first = 0; first < n; first += kChunkFloats) {
    const int64_t len = std::min(kChunkFloats, n - first);
    at::Tensor staged = pinned_floats(len);
    if (!staged.defined()) {
      staged = at::from_blob(const_cast<float*>(x + first), {len}, at::kFloat);
      flat.narrow(0, first, len).copy_(staged);
      continue;
    }
    host_copy(staged.data_ptr<float>(), x + first, len);
    // Asynchronous: the allocator holds the pinned block until the copy is done.
    flat.narrow(0, first, len).copy_(staged, /*non_blocking=*/true);
  }
  return out;
}

// The device's x [m, n] into the host's c.
void to_host(const at::Tensor& x, float* c) {
  const int64_t n = x.numel();
  at::Tensor staged = pinned_floats(n);
  if (!staged.defined()) {
    at::from_blob(c, x.sizes(), at::kFloat).copy_(x);
    return;
  }
  staged.copy_(x.view({-1}), /*non_blocking=*/true);
  c10::cuda::getCurrentCUDAStream().synchronize();
  host_copy(c, staged.data_ptr<float>(), n);
}

class CudaFp32Device final : public JudgeDevice {
 public:
  CudaFp32Device(c10::DeviceIndex index, std::shared_future<void> after)
      : index_(index), after_(std::move(after)) {}

  std::string name() const override { return "cuda:" + std::to_string(index_); }
  int64_t products() const override { return products_; }

  bool multiply(const reference::Fp32Product& p, float* c) override {
    after_.wait();
    // TF32 would round each operand to 10 bits of mantissa, outside the product's bound (read
    // after the baseline: an implementation may have set it).
    if (at::globalContext().allowTF32CuBLAS()) return false;
    const c10::cuda::CUDAGuard guard(index_);
    const at::Device gpu(at::kCUDA, index_);
    try {
      const auto a = p.ta ? to_gpu(p.a, p.k, p.m, gpu).t() : to_gpu(p.a, p.m, p.k, gpu);
      const auto b = p.tb ? to_gpu(p.b, p.n, p.k, gpu).t() : to_gpu(p.b, p.k, p.n, gpu);
      to_host(at::mm(a, b), c);
    } catch (const c10::OutOfMemoryError&) {
      return false;  // the case's own tensors fill the GPU: the host computes this one
    }
    ++products_;
    return true;
  }

 private:
  c10::DeviceIndex index_;
  std::shared_future<void> after_;
  int64_t products_ = 0;
};

}  // namespace

std::unique_ptr<JudgeDevice> cuda_fp32_device(std::shared_future<void> after) {
  return std::make_unique<CudaFp32Device>(c10::cuda::current_device(), std::move(after));
}
#else
std::unique_ptr<JudgeDevice> cuda_fp32_device(std::shared_future<void>) {
  return nullptr;
}
#endif

}  // namespace gradscope

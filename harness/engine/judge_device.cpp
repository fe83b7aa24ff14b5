#include "harness/engine/judge_device.h"

#include <ATen/ATen.h>

#include <string>
#include <utility>

#ifdef GRADSCOPE_WITH_CUDA
#include <ATen/Context.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#endif

namespace gradscope {

#ifdef GRADSCOPE_WITH_CUDA
namespace {

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
    const auto host = at::TensorOptions().dtype(at::kFloat);
    const auto to_gpu = [&](const float* x, int64_t rows, int64_t cols) {
      return at::from_blob(const_cast<float*>(x), {rows, cols}, host)
          .to(at::Device(at::kCUDA, index_));
    };
    try {
      const auto a = p.ta ? to_gpu(p.a, p.k, p.m).t() : to_gpu(p.a, p.m, p.k);
      const auto b = p.tb ? to_gpu(p.b, p.n, p.k).t() : to_gpu(p.b, p.k, p.n);
      at::from_blob(c, {p.m, p.n}, host).copy_(at::mm(a, b));
    } catch (const c10::OutOfMemoryError&) {
      return false;  // the case's own tensors fill the GPU: the host computes this one
    }
    ++products_;
    return true;
  }

  // Page-locked host memory: the copies to and from the GPU then run at the bus's speed,
  // without the driver's staging copy of pageable memory. Torch's caching host allocator keeps
  // each block for the process once freed, so later cases reuse it.
  float* staging(int slot, int64_t count) override {
    if (slot < 0 || slot >= kSlots) return nullptr;
    after_.wait();  // allocating would otherwise run inside the baseline's phase
    if (at::globalContext().allowTF32CuBLAS()) return nullptr;  // multiply will decline
    const c10::cuda::CUDAGuard guard(index_);
    auto& t = staging_[slot];
    if (!t.defined() || t.numel() < count) {
      t = at::Tensor();  // back to the cache before a larger one is taken
      try {
        t = at::empty({count}, at::TensorOptions().dtype(at::kFloat).pinned_memory(true));
      } catch (const c10::Error&) {
        return nullptr;  // no page-locked memory to spare: the operands stay pageable
      }
    }
    return t.data_ptr<float>();
  }

 private:
  static constexpr int kSlots = 3;
  c10::DeviceIndex index_;
  std::shared_future<void> after_;
  int64_t products_ = 0;
  at::Tensor staging_[kSlots];
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

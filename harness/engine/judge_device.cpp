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

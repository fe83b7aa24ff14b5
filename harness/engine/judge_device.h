// The case's GPU as the device of the floor's fp32 products (reference::Fp32Device): the
// judges run on the host, and the weight-sized products of squares that are most of the
// floor's time go to the GPU, each checked against its operands on the host
// (docs/verification.md, "The floor's products on the GPU").
#pragma once

#include <cstdint>
#include <future>
#include <memory>

#include "reference/dense_product.h"

namespace gradscope {

class JudgeDevice : public reference::Fp32Device {
 public:
  // The products it computed (the metric floor.gpu_products).
  virtual int64_t products() const = 0;
};

// The current CUDA device of the calling thread, captured now (the judges run on another
// thread); nullptr where gradscope is built without CUDA. Its first product waits for `after`
// (the baseline's phase: its time and peak device memory stay its own).
std::unique_ptr<JudgeDevice> cuda_fp32_device(std::shared_future<void> after);

}  // namespace gradscope

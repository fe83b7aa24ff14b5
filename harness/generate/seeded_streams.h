// Per-tensor random streams: every generated tensor draws from its own stream,
// keyed by (case seed, tensor name), with element i computed from counter i.
// Values therefore do not depend on creation order, thread count or device.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string_view>
#include <vector>

#include "harness/generate/philox.h"

namespace gradscope {

class SeededStream {
 public:
  SeededStream(uint64_t seed, std::string_view name);

  // Four independent 32-bit words for element `index`.
  philox::Counter block(uint64_t index) const;
  // Uniform in the open interval (0, 1), 53 random bits.
  double uniform(uint64_t index) const;
  // Standard normal (Box-Muller on the two uniforms of the element's block).
  double normal(uint64_t index) const;
  uint64_t bits64(uint64_t index) const;

  const philox::Key& key() const { return key_; }

 private:
  philox::Key key_;
};

// fp64 host tensors (the master copies every implementation converts from).
at::Tensor normal_tensor(uint64_t seed, std::string_view name, at::IntArrayRef shape,
                         double stddev = 1.0);
// The same values rounded to fp32 as they are drawn: bit for bit normal_tensor(...).to(kFloat),
// without the fp64 copy (a generated weight is the size of the layer).
at::Tensor normal_tensor_fp32(uint64_t seed, std::string_view name, at::IntArrayRef shape,
                              double stddev = 1.0);
at::Tensor uniform_tensor(uint64_t seed, std::string_view name, at::IntArrayRef shape);
// A permutation of 0..n-1 (int64), e.g. the act-order quantization order.
at::Tensor permutation(uint64_t seed, std::string_view name, int64_t n);

}  // namespace gradscope

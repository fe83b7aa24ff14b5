// Sharding of parameters over a c10d backend (ProcessGroupGloo on CPUs, ProcessGroupNCCL on
// GPUs), the two ways PyTorch's FSDP does it. Communication is c10d's own
// (_allgather_base, _reduce_scatter_base); nothing here moves bytes by itself. Gathers copy
// bytes, so float views of packed integer words come back bit for bit, NaN and subnormal
// patterns included.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>

#include <functional>
#include <optional>
#include <vector>

namespace gradscope {

enum class ShardingStrategy {
  kFlat,          // FSDP1: parameters of one dtype flattened into one buffer, padded to a
                  // multiple of the world size, split into equal contiguous shards
  kPerParameter,  // FSDP2: each parameter split along dim 0 (padded to a multiple of the
                  // world size)
};

// A parameter as a loader knows it before reading any of its bytes.
struct ParameterLayout {
  std::vector<int64_t> shape;
  at::ScalarType dtype;
};

// Elements [begin, end) of parameter `index`, row-major, as a 1-D tensor of its dtype that the
// caller may keep (on any device).
using ElementReader = std::function<at::Tensor(size_t index, int64_t begin, int64_t end)>;

class ShardedParameters {
 public:
  // Low-memory loading: reads only this rank's elements through `read`, a piece at a time,
  // and keeps them on `device`; `params` (one per layout) are set to empty tensors on
  // `device` and get their full value only in gather(). Neither another rank's elements nor
  // a full parameter are ever read or allocated here.
  ShardedParameters(std::vector<at::Tensor> params, const std::vector<ParameterLayout>& layouts,
                    const ElementReader& read, ShardingStrategy strategy,
                    c10::intrusive_ptr<c10d::Backend> backend, at::Device device);
  // `params` are the full tensors, identical on every rank (on any device). Keeps this rank's
  // shards on `device` (default: the first parameter's device, for all) and releases the full
  // tensors' storage (the tensors stay, empty, on `device`) until gather(): a module built on the
  // host from packed tensors moves to a GPU shard by shard, never whole.
  ShardedParameters(std::vector<at::Tensor> params, ShardingStrategy strategy,
                    c10::intrusive_ptr<c10d::Backend> backend,
                    std::optional<at::Device> device = std::nullopt);

  // All-gather: every parameter gets its full value back, in its own tensor.
  void gather();
  // Frees the full parameters' storage again (after forward and backward).
  void release();
  // Sums `full` (one tensor per parameter, same shapes) over the ranks and returns this
  // rank's shards of the sum (reduce-scatter), laid out like shards(); fp16/bf16 tensors are
  // summed in fp32 and returned in their own dtype.
  std::vector<at::Tensor> reduce_scatter(const std::vector<at::Tensor>& full) const;
  // The full tensors from shards laid out like shards(), as new tensors (state dicts, checks).
  std::vector<at::Tensor> gather_copy(const std::vector<at::Tensor>& shards) const;

  // This rank's shards: one per dtype group (flat) or one per parameter (per-parameter).
  std::vector<at::Tensor>& shards() { return shards_; }
  const std::vector<at::Tensor>& parameters() const { return params_; }
  int64_t world_size() const { return backend_->getSize(); }
  int64_t rank() const { return backend_->getRank(); }

 private:
  struct Group {  // flat: the parameters of one dtype
    std::vector<size_t> members;
    int64_t numel = 0, shard_numel = 0;
  };
  at::Tensor flatten(const Group& g, const std::vector<at::Tensor>& tensors) const;

  std::vector<at::Tensor> params_;
  std::vector<std::vector<int64_t>> shapes_;
  ShardingStrategy strategy_;
  c10::intrusive_ptr<c10d::Backend> backend_;
  std::vector<Group> groups_;  // flat only
  std::vector<at::Tensor> shards_;
};

}  // namespace gradscope

#include "gradscope/fsdp_shards.h"

#include <ATen/ATen.h>

#include <algorithm>

namespace gradscope {
namespace {

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

// Rows padded with zeros up to `rows` (dim 0).
at::Tensor padded_rows(const at::Tensor& t, int64_t rows) {
  if (t.size(0) == rows) return t.contiguous();
  auto shape = t.sizes().vec();
  shape[0] = rows - t.size(0);
  return at::cat({t, at::zeros(shape, t.options())});
}

}  // namespace

ShardedParameters::ShardedParameters(std::vector<at::Tensor> params, ShardingStrategy strategy,
                                     c10::intrusive_ptr<c10d::Backend> backend)
    : params_(std::move(params)), strategy_(strategy), backend_(std::move(backend)) {
  const int64_t world = world_size();
  for (const auto& p : params_) {
    TORCH_CHECK(p.dim() >= 1, "ShardedParameters: a parameter has no dimension to shard");
    shapes_.push_back(p.sizes().vec());
  }
  if (strategy_ == ShardingStrategy::kFlat) {
    for (size_t i = 0; i < params_.size(); ++i) {
      auto it = std::find_if(groups_.begin(), groups_.end(), [&](const Group& g) {
        return params_[g.members.front()].scalar_type() == params_[i].scalar_type();
      });
      if (it == groups_.end()) it = groups_.insert(groups_.end(), Group{});
      it->members.push_back(i);
      it->numel += params_[i].numel();
    }
    for (auto& g : groups_) {
      g.shard_numel = ceil_div(g.numel, world);
      shards_.push_back(shard_of(flatten(g, params_), g.shard_numel));
    }
  } else {
    for (const auto& p : params_) {
      const int64_t per = ceil_div(p.size(0), world);
      shards_.push_back(shard_of(padded_rows(p, per * world), per));
    }
  }
  release();
}

at::Tensor ShardedParameters::shard_of(const at::Tensor& full, int64_t shard_size) const {
  return full.narrow(0, rank() * shard_size, shard_size).clone();
}

at::Tensor ShardedParameters::flatten(const Group& g,
                                      const std::vector<at::Tensor>& tensors) const {
  std::vector<at::Tensor> parts;
  for (size_t m : g.members) parts.push_back(tensors[m].reshape(-1));
  const int64_t pad = g.shard_numel * world_size() - g.numel;
  if (pad > 0) parts.push_back(at::zeros({pad}, parts.front().options()));
  return at::cat(parts);
}

std::vector<at::Tensor> ShardedParameters::gather_copy(
    const std::vector<at::Tensor>& shards) const {
  const int64_t world = world_size();
  std::vector<at::Tensor> full(params_.size());
  for (size_t s = 0; s < shards.size(); ++s) {
    auto shard = shards[s].contiguous();
    auto sizes = shard.sizes().vec();
    sizes[0] *= world;
    auto out = at::empty(sizes, shard.options());
    backend_->_allgather_base(out, shard)->wait();
    if (strategy_ == ShardingStrategy::kFlat) {
      int64_t offset = 0;
      for (size_t m : groups_[s].members) {
        const int64_t n = c10::multiply_integers(shapes_[m]);
        full[m] = out.narrow(0, offset, n).view(shapes_[m]);
        offset += n;
      }
    } else {
      full[s] = out.narrow(0, 0, shapes_[s][0]);
    }
  }
  return full;
}

void ShardedParameters::gather() {
  const auto full = gather_copy(shards_);
  const at::NoGradGuard no_grad;
  // The parameters become views of the gathered buffers, as FSDP's do.
  for (size_t i = 0; i < params_.size(); ++i) params_[i].set_(full[i]);
}

void ShardedParameters::release() {
  const at::NoGradGuard no_grad;
  for (auto& p : params_) p.set_(at::empty({0}, p.options()));
}

std::vector<at::Tensor> ShardedParameters::reduce_scatter(
    const std::vector<at::Tensor>& full) const {
  TORCH_CHECK(full.size() == params_.size(), "ShardedParameters::reduce_scatter: ", full.size(),
              " tensors for ", params_.size(), " parameters");
  const int64_t world = world_size();
  std::vector<at::Tensor> inputs;
  if (strategy_ == ShardingStrategy::kFlat) {
    for (const auto& g : groups_) inputs.push_back(flatten(g, full));
  } else {
    for (size_t i = 0; i < full.size(); ++i) {
      inputs.push_back(padded_rows(full[i], ceil_div(shapes_[i][0], world) * world));
    }
  }
  std::vector<at::Tensor> out;
  for (auto& in : inputs) {
    auto sizes = in.sizes().vec();
    sizes[0] /= world;
    auto shard = at::empty(sizes, in.options());
    c10d::ReduceScatterOptions opts;
    opts.reduceOp = c10d::ReduceOp::SUM;
    backend_->_reduce_scatter_base(shard, in, opts)->wait();
    out.push_back(shard);
  }
  return out;
}

}  // namespace gradscope

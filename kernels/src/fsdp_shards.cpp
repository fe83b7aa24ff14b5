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

ShardedParameters::ShardedParameters(std::vector<at::Tensor> params,
                                     const std::vector<ParameterLayout>& layouts,
                                     const ElementReader& read, ShardingStrategy strategy,
                                     c10::intrusive_ptr<c10d::Backend> backend, at::Device device)
    : params_(std::move(params)), strategy_(strategy), backend_(std::move(backend)) {
  TORCH_CHECK(params_.size() == layouts.size(), "ShardedParameters: ", params_.size(),
              " parameters for ", layouts.size(), " layouts");
  const int64_t world = world_size(), rank = this->rank();
  for (size_t i = 0; i < layouts.size(); ++i) {
    TORCH_CHECK(!layouts[i].shape.empty(),
                "ShardedParameters: a parameter has no dimension to shard");
    TORCH_CHECK(params_[i].scalar_type() == layouts[i].dtype, "ShardedParameters: parameter ", i,
                " is ", params_[i].scalar_type(), ", its layout says ", layouts[i].dtype);
    shapes_.push_back(layouts[i].shape);
  }
  const auto options = [&](size_t i) { return at::TensorOptions(layouts[i].dtype).device(device); };
  // Elements [begin, end) of parameter i on `device`, checked against what was asked for.
  const auto piece = [&](size_t i, int64_t begin, int64_t end) {
    auto t = read(i, begin, end);
    TORCH_CHECK(t.dim() == 1 && t.numel() == end - begin && t.scalar_type() == layouts[i].dtype,
                "ShardedParameters: the reader gave ", t.sizes(), " ", t.scalar_type(),
                " for elements [", begin, ", ", end, ") of parameter ", i, " (", layouts[i].dtype,
                ")");
    return t.to(device);
  };
  if (strategy_ == ShardingStrategy::kFlat) {
    for (size_t i = 0; i < layouts.size(); ++i) {
      auto it = std::find_if(groups_.begin(), groups_.end(), [&](const Group& g) {
        return layouts[g.members.front()].dtype == layouts[i].dtype;
      });
      if (it == groups_.end()) it = groups_.insert(groups_.end(), Group{});
      it->members.push_back(i);
      it->numel += c10::multiply_integers(layouts[i].shape);
    }
    // This rank's range of the group's concatenation, zero padded at the end.
    for (auto& g : groups_) {
      g.shard_numel = ceil_div(g.numel, world);
      const int64_t lo = rank * g.shard_numel, hi = lo + g.shard_numel;
      std::vector<at::Tensor> parts;
      int64_t offset = 0, filled = 0;
      for (size_t m : g.members) {
        const int64_t n = c10::multiply_integers(layouts[m].shape);
        const int64_t a = std::max(lo, offset), b = std::min(hi, offset + n);
        if (a < b) {
          parts.push_back(piece(m, a - offset, b - offset));
          filled += b - a;
        }
        offset += n;
      }
      if (filled < g.shard_numel || parts.empty()) {  // parts is empty for an empty group
        parts.push_back(at::zeros({g.shard_numel - filled}, options(g.members.front())));
      }
      shards_.push_back(parts.size() == 1 ? parts.front() : at::cat(parts));
    }
  } else {
    // Rows [rank * per, (rank + 1) * per) of each parameter, zero rows past its end.
    for (size_t i = 0; i < layouts.size(); ++i) {
      const auto& shape = layouts[i].shape;
      const int64_t rows = shape[0], per = ceil_div(rows, world);
      const int64_t row_numel = rows ? c10::multiply_integers(shape) / rows : 0;
      const int64_t a = std::min(rows, rank * per), b = std::min(rows, a + per);
      auto sizes = shape;
      sizes[0] = per;
      if (b - a == per) {  // no padding: the piece is the shard
        shards_.push_back(piece(i, a * row_numel, b * row_numel).view(sizes));
        continue;
      }
      auto shard = at::zeros(sizes, options(i));
      if (a < b) shard.narrow(0, 0, b - a).view(-1).copy_(piece(i, a * row_numel, b * row_numel));
      shards_.push_back(shard);
    }
  }
  const at::NoGradGuard no_grad;
  for (size_t i = 0; i < params_.size(); ++i) {
    // set_data: the parameter may move to `device` (set_ keeps a tensor on its device).
    params_[i].set_data(at::empty({0}, options(i)));
  }
}

namespace {

std::vector<ParameterLayout> layouts_of(const std::vector<at::Tensor>& params) {
  std::vector<ParameterLayout> layouts;
  for (const auto& p : params) layouts.push_back({p.sizes().vec(), p.scalar_type()});
  return layouts;
}

// Reads from the full tensors themselves; the shards copy what they keep.
ElementReader reader_of(const std::vector<at::Tensor>& params) {
  std::vector<at::Tensor> flat;
  for (const auto& p : params) flat.push_back(p.reshape(-1));
  return [flat](size_t i, int64_t begin, int64_t end) {
    return flat[i].narrow(0, begin, end - begin).clone();
  };
}

}  // namespace

ShardedParameters::ShardedParameters(std::vector<at::Tensor> params, ShardingStrategy strategy,
                                     c10::intrusive_ptr<c10d::Backend> backend,
                                     std::optional<at::Device> device)
    : ShardedParameters(
          params, layouts_of(params), reader_of(params), strategy, std::move(backend),
          device ? *device : (params.empty() ? at::Device(at::kCPU) : params.front().device())) {}

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
    // fp16/bf16 gradients are summed in fp32 (FSDP's reduce_dtype = fp32): a sum of the ranks'
    // partial gradients can leave fp16's range where the total does not.
    const auto dtype = in.scalar_type();
    at::Tensor wire = at::isReducedFloatingType(dtype) ? in.to(at::kFloat) : in;
    auto sizes = wire.sizes().vec();
    sizes[0] /= world;
    auto shard = at::empty(sizes, wire.options());
    c10d::ReduceScatterOptions opts;
    opts.reduceOp = c10d::ReduceOp::SUM;
    backend_->_reduce_scatter_base(shard, wire, opts)->wait();
    out.push_back(shard.to(dtype));
  }
  return out;
}

}  // namespace gradscope

#include "harness/checkpoint/checkpoint_shards.h"

#include <ATen/ATen.h>

namespace gradscope {

GptqWeight ShardedModule::packed() const {
  return packed_from_storage(parameters[0], parameters[1], parameters[2], parameters[3], bits,
                             format);
}

at::Tensor ShardedModule::bias() const {
  return parameters.size() > 4 ? parameters[4] : at::Tensor();
}

ShardedModule shard_checkpoint_module(const GptqCheckpoint& checkpoint, const std::string& module,
                                      at::ScalarType view, ShardingStrategy strategy,
                                      c10::intrusive_ptr<c10d::Backend> backend,
                                      at::Device device) {
  const auto loaded = checkpoint.load_without_qweight(module);
  const auto& small = loaded.weight;
  // qweight's shape in `view` elements: int32 [R, C] is [R, C * 4 / size(view)].
  const int64_t K = small.in_features();
  const int64_t rows = K * small.bits / 32;
  const int64_t cols = small.scales.size(1) * 4 / static_cast<int64_t>(c10::elementSize(view));
  std::vector<at::Tensor> kept = {as_stored_words(small.qzeros, view), small.scales,
                                  as_stored_words(small.g_idx, view)};
  if (loaded.bias.defined()) kept.push_back(loaded.bias);
  std::vector<ParameterLayout> layouts = {{{rows, cols}, view}};
  for (const auto& t : kept) layouts.push_back({t.sizes().vec(), t.scalar_type()});
  // The small tensors serve their pieces from host memory.
  const ElementReader read = [&](size_t i, int64_t begin, int64_t end) {
    if (i == 0) return checkpoint.read_qweight_elements(module, view, begin, end);
    return kept[i - 1].reshape(-1).narrow(0, begin, end - begin).clone();
  };
  ShardedModule out;
  out.bits = small.bits;
  out.format = small.format;
  for (const auto& l : layouts) out.parameters.push_back(at::empty({0}, l.dtype));
  out.shards = std::make_unique<ShardedParameters>(out.parameters, layouts, read, strategy,
                                                   std::move(backend), device);
  return out;
}

}  // namespace gradscope

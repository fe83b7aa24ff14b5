#include "harness/checkpoint_shards.h"

#include <ATen/ATen.h>

namespace gradscope {

GptqWeight ShardedModule::packed() const {
  GptqWeight w;
  w.qweight = as_packed_words(parameters[0], "qweight");
  w.qzeros = as_packed_words(parameters[1], "qzeros");
  w.scales = parameters[2];
  w.g_idx = as_packed_words(parameters[3], "g_idx");
  w.bits = bits;
  w.format = format;
  return w;
}

ShardedModule shard_checkpoint_module(const GptqCheckpoint& checkpoint, const std::string& module,
                                      at::ScalarType view, ShardingStrategy strategy,
                                      c10::intrusive_ptr<c10d::Backend> backend,
                                      at::Device device) {
  const auto small = checkpoint.load_without_qweight(module).weight;
  const auto as_view = [&](const at::Tensor& words) {
    return view == at::kInt ? words : as_float_view(words, view);
  };
  // qweight's shape in `view` elements: int32 [R, C] is [R, C * 4 / size(view)].
  const int64_t K = small.in_features();
  const int64_t rows = K * small.bits / 32;
  const int64_t cols = small.scales.size(1) * 4 / static_cast<int64_t>(c10::elementSize(view));
  const std::vector<at::Tensor> kept = {as_view(small.qzeros), small.scales, as_view(small.g_idx)};
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

#include "harness/checkpoint/checkpoint_writer.h"

#include <ATen/ATen.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>
#include <vector>

#include "harness/checkpoint/gptq_config.h"
#include "harness/common/file_system.h"
#include "harness/common/host_memory.h"
#include "harness/common/input_error.h"
#include "harness/common/llama_projections.h"
#include "harness/generate/gptq_layer_gen.h"
#include "reports/output_file.h"

namespace gradscope {

using nlohmann::json;

void export_checkpoint(const ExportOptions& o) {
  if (files::is_directory(o.dir) || files::is_regular_file(o.dir)) {
    throw InputError("--out " + o.dir + ": already exists (export writes a new folder)");
  }
  if (!files::is_directory(files::parent_directory(o.dir))) {
    throw InputError("--out " + o.dir + ": folder " + files::parent_directory(o.dir) +
                     " does not exist");
  }
  if (o.shards < 1 || o.shards > o.layers) {
    throw InputError("--shards must be between 1 and --layers (" + std::to_string(o.layers) + ")");
  }
  ModelDims dims{o.hidden, o.intermediate, o.heads, o.kv_heads, o.layers};
  if (o.heads <= 0 || o.kv_heads <= 0 || o.hidden % o.heads || o.heads % o.kv_heads) {
    throw InputError("--hidden " + std::to_string(o.hidden) + ", --heads " +
                     std::to_string(o.heads) + " and --kv-heads " + std::to_string(o.kv_heads) +
                     " do not divide");
  }
  const auto q =
      quantize_options(o.bits, o.group_size, o.sym, o.desc_act, o.static_groups, o.format);
  for (const auto& projection : kLlamaProjections) {
    const std::string p(projection.name);
    const auto [in, out] = projection_shape(dims, p);
    if (in % packing_multiple(o.bits) != 0 || out % packing_multiple(o.bits) != 0) {
      throw InputError(std::string(p) + " [" + std::to_string(in) + " -> " + std::to_string(out) +
                       "] cannot be packed at " + std::to_string(o.bits) + " bits (multiples of " +
                       std::to_string(packing_multiple(o.bits)) + " needed)");
    }
  }

  // What the export holds at once, estimated before allocating: one projection quantized in
  // fp64 (a few copies of in x out) and every packed layer until the files are written.
  double largest = 0, packed = 0;
  for (const auto& projection : kLlamaProjections) {
    const std::string p(projection.name);
    const auto [in, out] = projection_shape(dims, p);
    largest = std::max(largest, 4.0 * 8.0 * static_cast<double>(in) * static_cast<double>(out));
    packed += static_cast<double>(o.layers) * static_cast<double>(in) * static_cast<double>(out) *
              o.bits / 8.0;
  }
  const double memory = host_memory_bytes();
  if (memory > 0 && largest + packed > memory) {
    throw InputError("export of " + std::to_string(o.layers) + " layer(s) at hidden " +
                     std::to_string(o.hidden) + ", intermediate " + std::to_string(o.intermediate) +
                     " needs about " +
                     std::to_string(static_cast<int64_t>((largest + packed) / (1 << 30))) +
                     " GiB; this machine has " +
                     std::to_string(static_cast<int64_t>(memory / (1 << 30))) + " GiB");
  }

  files::StagedFolder staged(o.dir);  // the checkpoint appears whole or not at all
  const std::string& tmp = staged.path();
  std::vector<std::vector<safetensors::OutputTensor>> shards(o.shards);
  for (int64_t layer = 0; layer < o.layers; ++layer) {
    auto& shard = shards[layer * o.shards / o.layers];
    for (const auto& projection : kLlamaProjections) {
      const std::string p(projection.name);
      const auto [in, out] = projection_shape(dims, p);
      const std::string name = module_name(layer, p);
      const auto packed =
          pack_gptq(draw_seeded_layer(o.seed, name + ".", in, out, q), o.bits, o.format, at::kHalf);
      shard.push_back(to_safetensors(name + ".qweight", packed.qweight));
      shard.push_back(to_safetensors(name + ".qzeros", packed.qzeros));
      shard.push_back(to_safetensors(name + ".scales", packed.scales));
      shard.push_back(to_safetensors(name + ".g_idx", packed.g_idx));
    }
  }
  const std::map<std::string, std::string> meta = {{"format", "pt"},
                                                   {"producer", "gradscope export"}};
  if (o.shards == 1) {
    safetensors::write_file(tmp + "/model.safetensors", shards[0], meta);
  } else {
    json weight_map = json::object();
    for (int s = 0; s < o.shards; ++s) {
      char file[64];
      std::snprintf(file, sizeof file, "model-%05d-of-%05d.safetensors", s + 1, o.shards);
      for (const auto& t : shards[s]) weight_map[t.name] = file;
      safetensors::write_file(tmp + "/" + file, shards[s], meta);
    }
    report::write_output_file(
        tmp + "/model.safetensors.index.json",
        json{{"metadata", json::object()}, {"weight_map", weight_map}}.dump(2) + "\n");
  }
  json qc = {{"bits", o.bits},
             {"group_size", o.group_size},
             {"desc_act", o.desc_act},
             {"sym", o.sym},
             {"static_groups", o.static_groups},
             {"checkpoint_format", to_string(o.format)},
             {"quant_method", "gptq"}};
  report::write_output_file(tmp + "/quantize_config.json", qc.dump(2) + "\n");
  json config = {{"architectures", {"LlamaForCausalLM"}},
                 {"model_type", "llama"},
                 {"hidden_size", o.hidden},
                 {"intermediate_size", o.intermediate},
                 {"num_attention_heads", o.heads},
                 {"num_key_value_heads", o.kv_heads},
                 {"num_hidden_layers", o.layers}};
  report::write_output_file(tmp + "/config.json", config.dump(2) + "\n");
  staged.commit();
}

}  // namespace gradscope

// The GPTQ checkpoint's conventions: quantize_config.json (or config.json's
// quantization_config), the model's dimensions from config.json, module names and the
// safetensors dtypes of the tensors (docs/gptq-format.md). Problems are InputErrors naming
// the file and key.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <utility>

#include "gradscope/gptq_format.h"
#include "harness/checkpoint/safetensors_file.h"

namespace gradscope {
struct QuantizeConfig {
  int bits = 4;
  int group_size = -1;  // AutoGPTQ's default when absent
  bool desc_act = true;
  bool sym = true;
  bool static_groups = false;
  ZeroPointFormat format = ZeroPointFormat::kGptqV1;
  std::string file;  // where it was read from
};

struct ModelDims {
  int64_t hidden = 0, intermediate = 0, heads = 0, kv_heads = 0, layers = 0;
  int64_t head_dim() const { return heads ? hidden / heads : 0; }
};

// The module name of a projection: model.layers.<i>.self_attn.q_proj, ...mlp.down_proj.
std::string module_name(int64_t layer, const std::string& projection);

// One tensor as a safetensors entry: contiguous host bytes, I32, F16, BF16 or F32.
safetensors::OutputTensor to_safetensors(const std::string& name, const at::Tensor& t);
// A stored tensor's bytes as a host tensor of its dtype (I32, F16, BF16, else F32).
at::Tensor from_safetensors(const safetensors::File& file, const safetensors::TensorEntry& e);
// [in_features, out_features] of a projection of this model.
std::pair<int64_t, int64_t> projection_shape(const ModelDims& dims, const std::string& projection);

// A JSON file, parsed; an InputError naming the file when it is missing or malformed.
nlohmann::json read_json_file(const std::string& path);
// quantize_config.json, else config.json's quantization_config, of a checkpoint folder.
// The names a checkpoint reader reads directly inside the folder, by name rather than through
// the index: an output of a command over the checkpoint must not take one of them, even when
// no file has it yet (the reader would read it next time). Shards the index names exist.
inline constexpr const char* kCheckpointQuantizeFile = "quantize_config.json";
inline constexpr const char* kCheckpointModelFile = "config.json";
inline constexpr const char* kCheckpointIndexFile = "model.safetensors.index.json";
bool checkpoint_reads_name(const std::string& name);

QuantizeConfig read_quantize_config(const std::string& dir);
// config.json's dimensions; throws InputError when it or a required key is missing.
ModelDims read_model_dims(const std::string& dir);

}  // namespace gradscope

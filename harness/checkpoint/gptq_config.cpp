#include "harness/checkpoint/gptq_config.h"

#include <ATen/ATen.h>

#include <cstring>
#include <fstream>

#include "harness/common/file_system.h"
#include "harness/common/input_error.h"

namespace gradscope {
namespace {

using nlohmann::json;

}  // namespace

json read_json_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError(path + ": cannot read");
  try {
    return json::parse(in);
  } catch (const json::exception& e) {
    throw InputError(path + ": not valid JSON: " + e.what());
  }
}

namespace {

// A key of the quantization config, looked up at the top level and under "meta".
const json* config_key(const json& config, const std::string& key) {
  if (auto it = config.find(key); it != config.end() && !it->is_null()) return &*it;
  if (auto meta = config.find("meta"); meta != config.end() && meta->is_object()) {
    if (auto it = meta->find(key); it != meta->end() && !it->is_null()) return &*it;
  }
  return nullptr;
}

template <typename T>
T typed(const json& value, const std::string& where, const char* expected) {
  const bool ok = std::is_same_v<T, bool>          ? value.is_boolean()
                  : std::is_same_v<T, std::string> ? value.is_string()
                                                   : value.is_number_integer();
  if (!ok) throw InputError(where + " must be " + expected + ", got " + value.dump());
  return value.get<T>();
}

}  // namespace

QuantizeConfig read_quantize_config(const std::string& dir) {
  QuantizeConfig q;
  json config;
  if (files::is_regular_file(dir + "/quantize_config.json")) {
    q.file = dir + "/quantize_config.json";
    config = read_json_file(q.file);
  } else if (files::is_regular_file(dir + "/config.json")) {
    const auto model = read_json_file(dir + "/config.json");
    const auto it = model.find("quantization_config");
    if (it == model.end() || !it->is_object()) {
      throw InputError(dir +
                       ": no quantize_config.json and config.json has no "
                       "quantization_config object");
    }
    q.file = dir + "/config.json: quantization_config";
    config = *it;
  } else {
    throw InputError(dir + ": not a GPTQ checkpoint (no quantize_config.json or config.json)");
  }
  if (!config.is_object()) throw InputError(q.file + ": not a JSON object");
  const auto at = [&](const std::string& key) { return q.file + ": key '" + key + "'"; };
  if (const json* v = config_key(config, "quant_method")) {
    const auto method = typed<std::string>(*v, at("quant_method"), "a string");
    if (method != "gptq") throw InputError(at("quant_method") + " is '" + method + "', not 'gptq'");
  }
  if (const json* v = config_key(config, "bits")) q.bits = typed<int>(*v, at("bits"), "an integer");
  if (!is_supported_bits(q.bits)) {
    throw InputError(at("bits") + " is " + std::to_string(q.bits) + "; expected 2, 3, 4 or 8");
  }
  if (const json* v = config_key(config, "group_size")) {
    q.group_size = typed<int>(*v, at("group_size"), "an integer");
  }
  if (q.group_size == 0 || q.group_size < -1) {
    throw InputError(at("group_size") + " is " + std::to_string(q.group_size) +
                     "; expected -1 or a positive size");
  }
  if (const json* v = config_key(config, "desc_act"))
    q.desc_act = typed<bool>(*v, at("desc_act"), "a boolean");
  if (const json* v = config_key(config, "sym")) q.sym = typed<bool>(*v, at("sym"), "a boolean");
  if (const json* v = config_key(config, "static_groups")) {
    q.static_groups = typed<bool>(*v, at("static_groups"), "a boolean");
  }
  if (const json* v = config_key(config, "checkpoint_format")) {
    const auto name = typed<std::string>(*v, at("checkpoint_format"), "a string");
    try {
      q.format = parse_zero_point_format(name);
    } catch (const std::invalid_argument& e) {
      throw InputError(at("checkpoint_format") + ": " + e.what());
    }
  }
  return q;
}

ModelDims read_model_dims(const std::string& dir) {
  const std::string path = dir + "/config.json";
  if (!files::is_regular_file(path)) throw InputError(path + ": not found (model dimensions)");
  const auto config = read_json_file(path);
  const auto get = [&](const char* key, bool required, int64_t fallback) -> int64_t {
    const auto it = config.find(key);
    if (it == config.end() || it->is_null()) {
      if (required) throw InputError(path + ": missing key '" + key + "'");
      return fallback;
    }
    const auto v = typed<int64_t>(*it, path + ": key '" + key + "'", "an integer");
    if (v <= 0) throw InputError(path + ": key '" + key + "' must be positive");
    return v;
  };
  ModelDims d;
  d.hidden = get("hidden_size", true, 0);
  d.intermediate = get("intermediate_size", true, 0);
  d.heads = get("num_attention_heads", true, 0);
  d.kv_heads = get("num_key_value_heads", false, d.heads);
  d.layers = get("num_hidden_layers", true, 0);
  if (d.hidden % d.heads != 0 || d.heads % d.kv_heads != 0) {
    throw InputError(path + ": hidden_size " + std::to_string(d.hidden) + ", " +
                     std::to_string(d.heads) + " heads and " + std::to_string(d.kv_heads) +
                     " key/value heads do not divide");
  }
  return d;
}

namespace {

const char* safetensors_dtype(at::ScalarType t) {
  switch (t) {
    case at::kInt:
      return "I32";
    case at::kHalf:
      return "F16";
    case at::kBFloat16:
      return "BF16";
    case at::kFloat:
      return "F32";
    default:
      throw std::logic_error("no safetensors dtype for " + std::string(c10::toString(t)));
  }
}

at::ScalarType scalar_type(const std::string& dtype) {
  if (dtype == "I32") return at::kInt;
  if (dtype == "F16") return at::kHalf;
  if (dtype == "BF16") return at::kBFloat16;
  return at::kFloat;
}

}  // namespace

const char* const kProjections[7] = {"q_proj",    "k_proj",  "v_proj",   "o_proj",
                                     "gate_proj", "up_proj", "down_proj"};

safetensors::OutputTensor to_safetensors(const std::string& name, const at::Tensor& t) {
  const auto c = t.contiguous().cpu();
  safetensors::OutputTensor out;
  out.name = name;
  out.dtype = safetensors_dtype(c.scalar_type());
  out.shape = c.sizes().vec();
  out.bytes.assign(static_cast<const char*>(c.data_ptr()), c.nbytes());
  return out;
}

at::Tensor from_safetensors(const safetensors::File& file, const safetensors::TensorEntry& e) {
  auto t = at::empty(e.shape, at::TensorOptions().dtype(scalar_type(e.dtype)));
  if (t.nbytes() > 0) std::memcpy(t.data_ptr(), file.data(e), t.nbytes());
  return t;
}

std::string module_name(int64_t layer, const std::string& projection) {
  const bool attention = projection == "q_proj" || projection == "k_proj" ||
                         projection == "v_proj" || projection == "o_proj";
  return "model.layers." + std::to_string(layer) + (attention ? ".self_attn." : ".mlp.") +
         projection;
}

std::pair<int64_t, int64_t> projection_shape(const ModelDims& d, const std::string& p) {
  const int64_t kv = d.kv_heads * d.head_dim();
  if (p == "q_proj" || p == "o_proj") return {d.hidden, d.hidden};
  if (p == "k_proj" || p == "v_proj") return {d.hidden, kv};
  if (p == "gate_proj" || p == "up_proj") return {d.hidden, d.intermediate};
  if (p == "down_proj") return {d.intermediate, d.hidden};
  throw std::invalid_argument("unknown projection " + p);
}

}  // namespace gradscope

#include "harness/checkpoint/gptq_config.h"

#include "harness/common/llama_projections.h"

#include <ATen/ATen.h>

#include <cstring>
#include <optional>

#include "harness/common/file_system.h"
#include "harness/common/input_error.h"
#include "harness/common/json_input.h"

namespace gradscope {
namespace {

using nlohmann::json;

}  // namespace

json read_json_file(const std::string& path) {
  return read_json_input_file(path);
}

namespace {

// The keys that decide how the packed tensors decode.
const char* const kQuantizeKeys[] = {
    "quant_method", "bits", "group_size", "desc_act", "sym", "static_groups", "checkpoint_format"};

// A key of the quantization config, at the top level or under "meta" (GPTQModel writes
// both). A key given in both places with different values, or given as null, is refused:
// either would make the checkpoint mean two things.
const json* config_key(const json& config, const std::string& key, const std::string& file) {
  const json* top = nullptr;
  const json* meta = nullptr;
  if (auto it = config.find(key); it != config.end()) top = &*it;
  if (auto m = config.find("meta"); m != config.end() && m->is_object()) {
    if (auto it = m->find(key); it != m->end()) meta = &*it;
  }
  for (const auto* v : {top, meta}) {
    if (v && v->is_null()) {
      throw InputError(file + ": key '" + std::string(v == meta ? "meta." : "") + key +
                       "' is null; give a value or leave the key out");
    }
  }
  if (top && meta && *top != *meta) {
    throw InputError(file + ": key '" + key + "' is " + json_excerpt(*top) + " but meta." + key +
                     " is " + json_excerpt(*meta));
  }
  return top ? top : meta;
}

template <typename T>
T typed(const json& value, const std::string& where, const char* expected) {
  const bool ok = std::is_same_v<T, bool> ? value.is_boolean() : value.is_string();
  if (!ok) throw InputError(where + " must be " + expected + ", got " + json_excerpt(value));
  return value.get<T>();
}

QuantizeConfig parse_quantize_config(const json& config, const std::string& file) {
  QuantizeConfig q;
  q.file = file;
  if (!config.is_object()) throw InputError(q.file + ": not a JSON object");
  const auto at = [&](const std::string& key) { return q.file + ": key '" + key + "'"; };
  const auto key = [&](const char* k) { return config_key(config, k, q.file); };
  if (const json* v = key("quant_method")) {
    const auto method = typed<std::string>(*v, at("quant_method"), "a string");
    if (method != "gptq") throw InputError(at("quant_method") + " is '" + method + "', not 'gptq'");
  }
  if (const json* v = key("bits")) q.bits = static_cast<int>(json_integer(*v, at("bits"), 2, 8));
  if (!is_supported_bits(q.bits)) {
    throw InputError(at("bits") + " is " + std::to_string(q.bits) + "; expected 2, 3, 4 or 8");
  }
  if (const json* v = key("group_size")) {
    q.group_size = static_cast<int>(json_integer(*v, at("group_size"), -1, 1 << 30));
  }
  if (q.group_size == 0) {
    throw InputError(at("group_size") + " is 0; expected -1 or a positive size");
  }
  if (const json* v = key("desc_act")) q.desc_act = typed<bool>(*v, at("desc_act"), "a boolean");
  if (const json* v = key("sym")) q.sym = typed<bool>(*v, at("sym"), "a boolean");
  if (const json* v = key("static_groups")) {
    q.static_groups = typed<bool>(*v, at("static_groups"), "a boolean");
  }
  if (const json* v = key("checkpoint_format")) {
    const auto name = typed<std::string>(*v, at("checkpoint_format"), "a string");
    try {
      q.format = parse_zero_point_format(name);
    } catch (const std::invalid_argument& e) {
      throw InputError(at("checkpoint_format") + ": " + e.what());
    }
  }
  return q;
}

}  // namespace

bool checkpoint_reads_name(const std::string& name) {
  const std::string suffix = ".safetensors";
  return name == kCheckpointQuantizeFile || name == kCheckpointModelFile ||
         name == kCheckpointIndexFile ||
         (name.size() > suffix.size() &&
          name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0);
}

QuantizeConfig read_quantize_config(const std::string& dir) {
  const std::string quantize_file = dir + "/" + kCheckpointQuantizeFile;
  const std::string model_file = dir + "/" + kCheckpointModelFile;
  // A name that exists is read (and refused if it is not a regular file), never skipped.
  std::optional<json> model;
  const json* embedded = nullptr;
  if (files::exists(model_file)) {
    model = read_json_file(model_file);
    if (model->is_object()) {
      if (auto it = model->find("quantization_config"); it != model->end()) {
        if (!it->is_object()) {
          throw InputError(model_file + ": key 'quantization_config' must be an object, got " +
                           json_excerpt(*it));
        }
        embedded = &*it;
      }
    }
  }
  if (!files::exists(quantize_file)) {
    if (!embedded) {
      throw InputError(dir + (model ? ": no quantize_config.json and config.json has no "
                                      "quantization_config object"
                                    : ": not a GPTQ checkpoint (no quantize_config.json or "
                                      "config.json)"));
    }
    return parse_quantize_config(*embedded, model_file + ": quantization_config");
  }
  const json quantize = read_json_file(quantize_file);
  const QuantizeConfig q = parse_quantize_config(quantize, quantize_file);
  if (embedded) {
    // Both files describe the quantization: every key both give must agree.
    const std::string other = model_file + ": quantization_config";
    parse_quantize_config(*embedded, other);
    for (const char* k : kQuantizeKeys) {
      const json* a = config_key(quantize, k, quantize_file);
      const json* b = config_key(*embedded, k, other);
      if (a && b && *a != *b) {
        throw InputError(quantize_file + ": key '" + k + "' is " + json_excerpt(*a) + " but " +
                         other + " gives " + json_excerpt(*b));
      }
    }
  }
  return q;
}

ModelDims read_model_dims(const std::string& dir) {
  const std::string path = dir + "/" + kCheckpointModelFile;
  if (!files::exists(path)) throw InputError(path + ": not found (model dimensions)");
  const auto config = read_json_file(path);
  if (!config.is_object()) throw InputError(path + ": not a JSON object");
  // Dimensions up to 2^20 (a million features, heads or layers) cover every model.
  const auto get = [&](const char* key, bool required, int64_t fallback) -> int64_t {
    const auto it = config.find(key);
    if (it == config.end()) {
      if (required) throw InputError(path + ": missing key '" + key + "'");
      return fallback;
    }
    if (it->is_null()) {
      throw InputError(path + ": key '" + key + "' is null; give a value or leave the key out");
    }
    return json_integer(*it, path + ": key '" + key + "'", 1, int64_t{1} << 20);
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
  return "model.layers." + std::to_string(layer) + "." + std::string(module_of(projection)) + "." +
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

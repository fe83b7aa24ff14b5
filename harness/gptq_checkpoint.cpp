#include "harness/gptq_checkpoint.h"

#include <ATen/ATen.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "harness/file_system.h"
#include "harness/gptq_layer_gen.h"
#include "harness/input_error.h"
#include "reports/atomic_file.h"

namespace gradscope {
namespace {

using nlohmann::json;

json read_json(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError(path + ": cannot read");
  try {
    return json::parse(in);
  } catch (const json::exception& e) {
    throw InputError(path + ": not valid JSON: " + e.what());
  }
}

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

QuantizeConfig read_quantize_config(const std::string& dir) {
  QuantizeConfig q;
  json config;
  if (files::is_regular_file(dir + "/quantize_config.json")) {
    q.file = dir + "/quantize_config.json";
    config = read_json(q.file);
  } else if (files::is_regular_file(dir + "/config.json")) {
    const auto model = read_json(dir + "/config.json");
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
  const auto config = read_json(path);
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

constexpr const char* kProjections[] = {"q_proj",    "k_proj",  "v_proj",   "o_proj",
                                        "gate_proj", "up_proj", "down_proj"};

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

GptqCheckpoint::GptqCheckpoint(const std::string& dir) : dir_(dir) {
  if (!files::is_directory(dir)) throw InputError(dir + ": checkpoint folder not found");
  config_ = read_quantize_config(dir);
  try {
    dims_ = std::make_unique<ModelDims>(read_model_dims(dir));
  } catch (const InputError& e) {
    dims_error_ = e.what();  // only `run --checkpoint` needs the dimensions
  }
  const std::string index = dir + "/model.safetensors.index.json";
  if (files::is_regular_file(index)) {
    const auto j = read_json(index);
    const auto map = j.find("weight_map");
    if (!j.is_object() || map == j.end() || !map->is_object()) {
      throw InputError(index + ": no weight_map object");
    }
    for (const auto& [name, file] : map->items()) {
      if (!file.is_string())
        throw InputError(index + ": weight_map['" + name + "'] is not a file name");
      const auto f = file.get<std::string>();
      if (f.empty() || f.find('/') != std::string::npos || f[0] == '.') {
        throw InputError(index + ": weight_map['" + name + "'] names '" + f +
                         "', not a file in the checkpoint folder");
      }
      weight_map_[name] = dir + "/" + f;
    }
  } else {
    const auto found = files::find_files(dir, ".safetensors");
    std::vector<std::string> top;
    for (const auto& f : found) {
      if (files::parent_directory(f) == dir) top.push_back(f);
    }
    if (top.size() != 1) {
      throw InputError(dir +
                       ": expected model.safetensors.index.json or exactly one "
                       ".safetensors file, found " +
                       std::to_string(top.size()));
    }
    auto file = std::make_unique<safetensors::File>(top[0]);
    for (const auto& e : file->header().tensors) weight_map_[e.name] = top[0];
    files_[top[0]] = std::move(file);
  }
}

GptqCheckpoint::~GptqCheckpoint() = default;

const ModelDims& GptqCheckpoint::dims() const {
  if (!dims_) throw InputError(dims_error_);
  return *dims_;
}

std::vector<std::string> GptqCheckpoint::modules() const {
  std::vector<std::string> out;
  const std::string suffix = ".qweight";
  for (const auto& [name, file] : weight_map_) {
    if (name.size() > suffix.size() &&
        name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0) {
      out.push_back(name.substr(0, name.size() - suffix.size()));
    }
  }
  return out;
}

const safetensors::File& GptqCheckpoint::file_of(const std::string& tensor) const {
  const auto it = weight_map_.find(tensor);
  if (it == weight_map_.end()) throw InputError(dir_ + ": no tensor " + tensor);
  const std::lock_guard<std::mutex> lock(files_mutex_);
  auto& file = files_[it->second];
  if (!file) file = std::make_unique<safetensors::File>(it->second);
  return *file;
}

const safetensors::TensorEntry& GptqCheckpoint::entry(const std::string& name,
                                                      const char* const* dtypes,
                                                      int64_t rank) const {
  const auto& file = file_of(name);
  const auto* e = file.find(name);
  if (!e) throw InputError(file.path() + ": the index maps " + name + " here but it is absent");
  std::string accepted;
  bool ok = false;
  for (const char* const* d = dtypes; *d; ++d) {
    accepted += (accepted.empty() ? "" : " or ") + std::string(*d);
    ok = ok || e->dtype == *d;
  }
  if (!ok)
    throw InputError(file.path() + ": " + name + " is " + e->dtype + "; expected " + accepted);
  if (static_cast<int64_t>(e->shape.size()) != rank) {
    throw InputError(file.path() + ": " + name + " has " + std::to_string(e->shape.size()) +
                     " dimensions; expected " + std::to_string(rank));
  }
  return *e;
}

at::Tensor GptqCheckpoint::read(const std::string& name, const char* const* dtypes,
                                int64_t rank) const {
  return from_safetensors(file_of(name), entry(name, dtypes, rank));
}

namespace {
const char* const kI32[] = {"I32", nullptr};
}  // namespace

at::Tensor GptqCheckpoint::read_qweight_elements(const std::string& module, at::ScalarType view,
                                                 int64_t begin, int64_t end) const {
  const std::string name = module + ".qweight";
  const auto& e = entry(name, kI32, 2);
  const int64_t size = static_cast<int64_t>(c10::elementSize(view));
  const int64_t count = static_cast<int64_t>(e.end - e.begin) / size;
  if (4 % size != 0) {
    throw std::invalid_argument(name +
                                ": a view of int32 words needs elements of 1, 2 or 4 "
                                "bytes, not " +
                                std::string(c10::toString(view)));
  }
  if (begin < 0 || begin > end || end > count) {
    throw std::out_of_range(file_of(name).path() + ": " + name + " as " +
                            std::string(c10::toString(view)) + " has " + std::to_string(count) +
                            " elements; asked for [" + std::to_string(begin) + ", " +
                            std::to_string(end) + ")");
  }
  auto t = at::empty({end - begin}, at::TensorOptions().dtype(view));
  if (end > begin) std::memcpy(t.data_ptr(), file_of(name).data(e) + begin * size, t.nbytes());
  return t;
}

GptqCheckpoint::Layer GptqCheckpoint::load(const std::string& module) const {
  auto layer = load_without_qweight(module);
  layer.weight.qweight = read(module + ".qweight", kI32, 2);
  try {
    validate_gptq_weight(layer.weight);
  } catch (const c10::Error& e) {
    throw InputError(file_of(module + ".qweight").path() + ": " + module + ": " +
                     e.what_without_backtrace());
  }
  return layer;
}

GptqCheckpoint::Layer GptqCheckpoint::load_without_qweight(const std::string& module) const {
  static const char* const kScales[] = {"F16", "BF16", nullptr};
  static const char* const kBias[] = {"F16", "BF16", "F32", nullptr};
  const int b = config_.bits;
  if (!weight_map_.count(module + ".qweight")) {
    throw InputError(dir_ + ": no module " + module + " (no tensor " + module + ".qweight)");
  }
  Layer layer;
  auto& w = layer.weight;
  w.bits = b;
  w.format = config_.format;
  const auto qweight_shape = entry(module + ".qweight", kI32, 2).shape;
  w.qzeros = read(module + ".qzeros", kI32, 2);
  w.scales = read(module + ".scales", kScales, 2);
  w.g_idx = read(module + ".g_idx", kI32, 1);
  if (weight_map_.count(module + ".bias")) layer.bias = read(module + ".bias", kBias, 1);

  const std::string where = file_of(module + ".qweight").path() + ": " + module;
  const int64_t K = w.g_idx.size(0), N = qweight_shape[1];
  const auto expect = [&](const char* tensor, at::IntArrayRef got, std::vector<int64_t> want,
                          const std::string& why) {
    if (got != at::IntArrayRef(want)) {
      std::ostringstream msg;
      msg << where << "." << tensor << " has shape " << got << "; expected "
          << at::IntArrayRef(want) << " (" << why << ")";
      throw InputError(msg.str());
    }
  };
  if (K % packing_multiple(b) != 0 || N % packing_multiple(b) != 0) {
    throw InputError(where + ": in_features " + std::to_string(K) + " (from g_idx) and " +
                     "out_features " + std::to_string(N) + " must be multiples of " +
                     std::to_string(packing_multiple(b)) + " at " + std::to_string(b) + " bits");
  }
  const std::string bits_text = std::to_string(b) + "-bit";
  expect("qweight", qweight_shape, {K * b / 32, N},
         bits_text + ", in_features " + std::to_string(K) + " from g_idx");
  const int64_t G = num_groups(K, config_.group_size);
  expect("scales", w.scales.sizes(), {G, N},
         std::to_string(G) + " groups of " + std::to_string(config_.group_size));
  expect("qzeros", w.qzeros.sizes(), {G, N * b / 32}, bits_text + " zero points per group");
  if (layer.bias.defined()) expect("bias", layer.bias.sizes(), {N}, "out_features");

  const auto g = w.g_idx;
  const auto bad_g = (g.lt(0) | g.ge(G)).nonzero();
  if (bad_g.size(0) > 0) {
    const int64_t k = bad_g[0][0].item<int64_t>();
    throw InputError(where + ".g_idx[" + std::to_string(k) + "] is " +
                     std::to_string(g[k].item<int32_t>()) + "; expected a group in [0, " +
                     std::to_string(G) + ")");
  }
  const auto nonfinite = w.scales.to(at::kFloat).isfinite().logical_not().nonzero();
  if (nonfinite.size(0) > 0) {
    const int64_t r = nonfinite[0][0].item<int64_t>(), c = nonfinite[0][1].item<int64_t>();
    throw InputError(where + ".scales[" + std::to_string(r) + ", " + std::to_string(c) + "] is " +
                     std::to_string(w.scales[r][c].item<float>()) + " (" +
                     std::to_string(nonfinite.size(0)) + " non-finite scales)");
  }
  if (config_.format == ZeroPointFormat::kGptqV1) {
    // A v1 field of maxq is how a zero of 0 comes out of a v1 packer (0 - 1 spilled into
    // all ones): the layer cannot be decoded as the quantizer meant it.
    const auto fields = decode_zero_points(w.qzeros, b, N, ZeroPointFormat::kGptqV2);
    const auto spilled = fields.eq(max_code(b)).nonzero();
    if (spilled.size(0) > 0) {
      throw InputError(where + ".qzeros: group " + std::to_string(spilled[0][0].item<int64_t>()) +
                       ", column " + std::to_string(spilled[0][1].item<int64_t>()) + " stores " +
                       std::to_string(max_code(b)) + " in gptq (v1) format, i.e. " +
                       "a zero of 0 that v1 cannot represent (" + std::to_string(spilled.size(0)) +
                       " such zeros); re-export as gptq_v2");
    }
  }
  return layer;
}

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
  for (const char* p : kProjections) {
    const auto [in, out] = projection_shape(dims, p);
    if (in % packing_multiple(o.bits) != 0 || out % packing_multiple(o.bits) != 0) {
      throw InputError(std::string(p) + " [" + std::to_string(in) + " -> " + std::to_string(out) +
                       "] cannot be packed at " + std::to_string(o.bits) + " bits (multiples of " +
                       std::to_string(packing_multiple(o.bits)) + " needed)");
    }
  }

  const std::string tmp = o.dir + ".tmp." + std::to_string(::getpid());
  if (::mkdir(tmp.c_str(), 0755) != 0) throw InputError("cannot create " + tmp);
  try {
    std::vector<std::vector<safetensors::OutputTensor>> shards(o.shards);
    for (int64_t layer = 0; layer < o.layers; ++layer) {
      auto& shard = shards[layer * o.shards / o.layers];
      for (const char* p : kProjections) {
        const auto [in, out] = projection_shape(dims, p);
        const std::string name = module_name(layer, p);
        const auto packed = pack_gptq(quantize_seeded_layer(o.seed, name + ".", in, out, q), o.bits,
                                      o.format, at::kHalf);
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
      report::write_file_atomically(
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
    report::write_file_atomically(tmp + "/quantize_config.json", qc.dump(2) + "\n");
    json config = {{"architectures", {"LlamaForCausalLM"}},
                   {"model_type", "llama"},
                   {"hidden_size", o.hidden},
                   {"intermediate_size", o.intermediate},
                   {"num_attention_heads", o.heads},
                   {"num_key_value_heads", o.kv_heads},
                   {"num_hidden_layers", o.layers}};
    report::write_file_atomically(tmp + "/config.json", config.dump(2) + "\n");
    if (::rename(tmp.c_str(), o.dir.c_str()) != 0) throw InputError("cannot create " + o.dir);
  } catch (...) {
    for (const auto& f : files::find_files(tmp, "")) std::remove(f.c_str());
    ::rmdir(tmp.c_str());
    throw;
  }
}

}  // namespace gradscope

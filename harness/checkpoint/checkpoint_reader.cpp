#include "harness/checkpoint/checkpoint_reader.h"

#include <ATen/ATen.h>

#include <cstring>
#include <sstream>

#include "harness/common/file_system.h"
#include "harness/common/input_error.h"

namespace gradscope {

GptqCheckpoint::GptqCheckpoint(const std::string& dir) : dir_(dir) {
  if (!files::is_directory(dir)) throw InputError(dir + ": checkpoint folder not found");
  config_ = read_quantize_config(dir);
  try {
    dims_ = std::make_unique<ModelDims>(read_model_dims(dir));
  } catch (const InputError& e) {
    dims_error_ = e.what();  // only `run --checkpoint` needs the dimensions
  }
  const std::string index = dir + "/" + kCheckpointIndexFile;
  if (files::exists(index)) {  // read, and refused if it is not a regular file
    const auto j = read_json_file(index);
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
    const auto top = files::find_files(dir, ".safetensors", files::Walk::kTopLevel);
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

}  // namespace gradscope

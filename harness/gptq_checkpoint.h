// GPTQ checkpoints on disk: quantize_config.json (or config.json's quantization_config),
// the model's dimensions, safetensors files (single or sharded through
// model.safetensors.index.json), and the project's own writer of small checkpoints.
// Every tensor is checked against the config before use; problems are InputErrors
// naming the file and tensor.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "gradscope/gptq_format.h"
#include "harness/safetensors_file.h"

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

class GptqCheckpoint {
 public:
  explicit GptqCheckpoint(const std::string& dir);
  ~GptqCheckpoint();

  const std::string& dir() const { return dir_; }
  const QuantizeConfig& config() const { return config_; }
  // Read from config.json; throws InputError when it or a key is missing.
  const ModelDims& dims() const;
  // Modules holding a qweight, sorted.
  std::vector<std::string> modules() const;

  struct Layer {
    GptqWeight weight;  // CPU tensors
    at::Tensor bias;    // undefined when the checkpoint has none
  };
  Layer load(const std::string& module) const;
  // Low-memory loading: the module with qweight left undefined, every other tensor read and
  // all of it checked as load() checks it (qweight's shape from the file's header) ...
  Layer load_without_qweight(const std::string& module) const;
  // ... and qweight's words as elements [begin, end) of a bit-exact `view` (int32, or a
  // float view dtype), copied straight out of the mapped file: only those bytes are read.
  at::Tensor read_qweight_elements(const std::string& module, at::ScalarType view, int64_t begin,
                                   int64_t end) const;

 private:
  const safetensors::File& file_of(const std::string& tensor) const;
  const safetensors::TensorEntry& entry(const std::string& tensor, const char* const* dtypes,
                                        int64_t rank) const;
  at::Tensor read(const std::string& tensor, const char* const* dtypes, int64_t rank) const;

  std::string dir_;
  QuantizeConfig config_;
  std::unique_ptr<ModelDims> dims_;
  std::string dims_error_;
  std::map<std::string, std::string> weight_map_;  // tensor name -> file path
  // Opened on first use; ranks as threads share one checkpoint, hence the lock.
  mutable std::mutex files_mutex_;
  mutable std::map<std::string, std::unique_ptr<safetensors::File>> files_;
};

struct ExportOptions {
  std::string dir;
  int64_t layers = 1, hidden = 256, intermediate = 688, heads = 4, kv_heads = 2;
  int bits = 4;
  int group_size = 128;
  bool desc_act = false, sym = true, static_groups = false;
  ZeroPointFormat format = ZeroPointFormat::kGptqV1;
  uint64_t seed = 1;
  int shards = 1;  // > 1 writes model-0000i-of-0000n.safetensors and the index
};

// Writes a checkpoint of seeded, quantized layers (all 7 projections per layer) into a
// new folder: config.json, quantize_config.json and the safetensors file(s). The folder
// appears complete or not at all.
void export_checkpoint(const ExportOptions& options);

}  // namespace gradscope

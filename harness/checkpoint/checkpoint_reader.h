// Reading a GPTQ checkpoint: safetensors files, single or sharded through
// model.safetensors.index.json. Every tensor is checked against the config before use;
// problems are InputErrors naming the file and tensor.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "harness/checkpoint/gptq_config.h"

namespace gradscope {

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

}  // namespace gradscope

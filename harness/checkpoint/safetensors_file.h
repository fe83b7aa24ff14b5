// The safetensors container (docs/gptq-format.md): an 8-byte little-endian header
// length, a JSON header naming each tensor's dtype, shape and byte range, then the data.
// Reading memory-maps the file and checks the whole header before anything is used;
// writing is atomic. No torch here: the header parser is also a fuzz target.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace gradscope::safetensors {

struct TensorEntry {
  std::string name;
  std::string dtype;  // "I32", "F16", "BF16", "F32", ...
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // byte range inside the data buffer
  int64_t numel() const;
};

struct Header {
  std::vector<TensorEntry> tensors;  // sorted by name
  std::map<std::string, std::string> metadata;
  uint64_t data_offset = 0;  // where the data buffer starts in the file
};

// Bytes per element of a safetensors dtype; 0 for a name the format does not define.
size_t dtype_size(const std::string& dtype);

// Parses and checks the header of a whole file image: length inside the file, valid
// JSON object, known dtypes, non-negative shapes, byte ranges inside the buffer that
// match the shape and do not overlap. Throws InputError naming `path` and the tensor.
Header parse_header(const uint8_t* bytes, size_t size, const std::string& path);

class File {
 public:
  explicit File(const std::string& path);  // maps the file; throws InputError
  ~File();
  File(const File&) = delete;
  File& operator=(const File&) = delete;

  const std::string& path() const { return path_; }
  const Header& header() const { return header_; }
  const TensorEntry* find(const std::string& name) const;  // nullptr if absent
  const uint8_t* data(const TensorEntry& entry) const;

 private:
  std::string path_;
  const uint8_t* map_ = nullptr;
  size_t size_ = 0;
  Header header_;
};

struct OutputTensor {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
  std::string bytes;  // row-major, little-endian
};

// Writes tensors (sorted by name, data 8-byte aligned) and metadata atomically.
void write_file(const std::string& path, std::vector<OutputTensor> tensors,
                const std::map<std::string, std::string>& metadata);

}  // namespace gradscope::safetensors

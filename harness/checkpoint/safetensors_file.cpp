#include "harness/checkpoint/safetensors_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <nlohmann/json.hpp>

#include "harness/common/input_error.h"
#include "harness/common/json_input.h"
#include "reports/output_file.h"

namespace gradscope::safetensors {
namespace {

// A header larger than this is not a model's (the reference implementation caps it too).
constexpr uint64_t kMaxHeaderBytes = 100u << 20;

[[noreturn]] void fail(const std::string& path, const std::string& what) {
  throw InputError(path + ": " + what);
}

}  // namespace

int64_t TensorEntry::numel() const {
  int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

size_t dtype_size(const std::string& dtype) {
  static const std::map<std::string, size_t> sizes = {
      {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E4M3", 1}, {"F8_E5M2", 1},
      {"I16", 2},  {"U16", 2}, {"F16", 2}, {"BF16", 2},    {"I32", 4},
      {"U32", 4},  {"F32", 4}, {"I64", 8}, {"U64", 8},     {"F64", 8}};
  const auto it = sizes.find(dtype);
  return it == sizes.end() ? 0 : it->second;
}

Header parse_header(const uint8_t* bytes, size_t size, const std::string& path) {
  if (size < 8) fail(path, "not a safetensors file (" + std::to_string(size) + " bytes)");
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | bytes[i];
  if (n > kMaxHeaderBytes || n > size - 8) {
    fail(path, "header length " + std::to_string(n) + " exceeds the file (" + std::to_string(size) +
                   " bytes)");
  }
  // Strict JSON (harness/common/json_input.h): a tensor named twice is refused, not "the last
  // one wins".
  const nlohmann::json json = parse_json_input(
      std::string_view(reinterpret_cast<const char*>(bytes) + 8, n), path + ": header");
  if (!json.is_object()) fail(path, "header is not a JSON object");
  Header header;
  header.data_offset = 8 + n;
  const uint64_t buffer = size - header.data_offset;
  for (const auto& [name, value] : json.items()) {
    if (name == "__metadata__") {
      if (!value.is_object()) fail(path, "__metadata__ is not an object of strings");
      for (const auto& [key, text] : value.items()) {
        if (!text.is_string()) fail(path, "__metadata__." + key + " is not a string");
        header.metadata[key] = text.get<std::string>();
      }
      continue;
    }
    const std::string at = "tensor '" + name + "'";
    if (!value.is_object()) fail(path, at + " is not an object");
    TensorEntry e;
    e.name = name;
    const auto dtype = value.find("dtype");
    if (dtype == value.end() || !dtype->is_string()) fail(path, at + " has no dtype string");
    e.dtype = dtype->get<std::string>();
    const size_t element = dtype_size(e.dtype);
    if (element == 0) fail(path, at + " has unknown dtype '" + e.dtype + "'");
    const auto shape = value.find("shape");
    if (shape == value.end() || !shape->is_array()) fail(path, at + " has no shape array");
    uint64_t numel = 1;
    for (const auto& d : *shape) {
      if (!d.is_number_unsigned()) fail(path, at + " has a shape entry that is not a size");
      const auto v = d.get<uint64_t>();
      if (v > (uint64_t{1} << 62) || __builtin_mul_overflow(numel, v, &numel)) {
        fail(path, at + " has a shape whose size overflows");
      }
      e.shape.push_back(static_cast<int64_t>(v));
    }
    const auto offsets = value.find("data_offsets");
    if (offsets == value.end() || !offsets->is_array() || offsets->size() != 2 ||
        !(*offsets)[0].is_number_unsigned() || !(*offsets)[1].is_number_unsigned()) {
      fail(path, at + " has no data_offsets [begin, end]");
    }
    e.begin = (*offsets)[0].get<uint64_t>();
    e.end = (*offsets)[1].get<uint64_t>();
    if (e.begin > e.end || e.end > buffer) {
      fail(path, at + " data_offsets [" + std::to_string(e.begin) + ", " + std::to_string(e.end) +
                     ") lie outside the data buffer of " + std::to_string(buffer) + " bytes");
    }
    if (numel > buffer || e.end - e.begin != numel * element) {  // numel <= buffer: no overflow
      fail(path, at + " holds " + std::to_string(e.end - e.begin) + " bytes but its shape and " +
                     e.dtype + " need " + std::to_string(numel * element));
    }
    header.tensors.push_back(std::move(e));
  }
  std::sort(header.tensors.begin(), header.tensors.end(),
            [](const TensorEntry& a, const TensorEntry& b) { return a.begin < b.begin; });
  for (size_t i = 1; i < header.tensors.size(); ++i) {
    const auto& a = header.tensors[i - 1];
    const auto& b = header.tensors[i];
    if (b.begin < a.end) {
      fail(path, "tensors '" + a.name + "' and '" + b.name + "' overlap in the data buffer");
    }
  }
  std::sort(header.tensors.begin(), header.tensors.end(),
            [](const TensorEntry& a, const TensorEntry& b) { return a.name < b.name; });
  return header;
}

File::File(const std::string& path) : path_(path) {
  // O_NONBLOCK: a FIFO named as a shard must not block the open; fstat then refuses it.
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) fail(path, "cannot open (" + std::string(std::strerror(errno)) + ")");
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    fail(path, "not a regular file");
  }
  size_ = static_cast<size_t>(st.st_size);
  if (size_ > 0) {
    void* m = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (m == MAP_FAILED) {
      ::close(fd);
      fail(path, "cannot map (" + std::string(std::strerror(errno)) + ")");
    }
    map_ = static_cast<const uint8_t*>(m);
  }
  ::close(fd);
  try {
    header_ = parse_header(map_, size_, path);
  } catch (...) {
    if (map_) ::munmap(const_cast<uint8_t*>(map_), size_);
    throw;
  }
}

File::~File() {
  if (map_) ::munmap(const_cast<uint8_t*>(map_), size_);
}

const TensorEntry* File::find(const std::string& name) const {
  const auto it =
      std::lower_bound(header_.tensors.begin(), header_.tensors.end(), name,
                       [](const TensorEntry& e, const std::string& n) { return e.name < n; });
  return it != header_.tensors.end() && it->name == name ? &*it : nullptr;
}

const uint8_t* File::data(const TensorEntry& entry) const {
  return map_ + header_.data_offset + entry.begin;
}

void write_file(const std::string& path, std::vector<OutputTensor> tensors,
                const std::map<std::string, std::string>& metadata) {
  std::sort(tensors.begin(), tensors.end(),
            [](const OutputTensor& a, const OutputTensor& b) { return a.name < b.name; });
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const auto& t : tensors) {
    header[t.name] = {{"dtype", t.dtype},
                      {"shape", t.shape},
                      {"data_offsets", {offset, offset + t.bytes.size()}}};
    offset += t.bytes.size();
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // the buffer starts 8-byte aligned
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((text.size() >> (8 * i)) & 0xFF);
  out += text;
  for (const auto& t : tensors) out += t.bytes;
  report::write_output_file(path, out);
}

}  // namespace gradscope::safetensors

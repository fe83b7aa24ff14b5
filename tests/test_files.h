// Temporary case files for tests; removed with the fixture (harness/common/file_system.h's
// POSIX helpers, not std::filesystem: see there for why).
#pragma once

#include <fstream>
#include <iterator>
#include <string>

#include "harness/common/file_system.h"

namespace gradscope::testing {

class TempDir {
 public:
  TempDir() : path_(files::make_temp_dir("gradscope-test")) {}
  ~TempDir() { files::remove_tree(path_); }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  // Writes `text` to a file directly inside the folder and returns its path.
  std::string write(const std::string& name, const std::string& text) const {
    const std::string p = path(name);
    std::ofstream(p) << text;
    return p;
  }
  std::string path(const std::string& name = "") const {
    return name.empty() ? path_ : path_ + "/" + name;
  }

 private:
  std::string path_;
};

// A small lora_w case that runs in well under a second.
inline constexpr const char* kSmallCase = R"(kind = "lora_w"
in_features = 64
out_features = 32
)";

// The bytes of a file ("" when it cannot be read).
inline std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

}  // namespace gradscope::testing

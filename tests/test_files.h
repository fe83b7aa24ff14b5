// Temporary case files for tests; removed with the fixture. POSIX calls, not
// std::filesystem (see harness/file_system.h for why).
#pragma once

#include <ftw.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <stdexcept>
#include <string>

namespace gradscope::testing {

class TempDir {
 public:
  TempDir() {
    std::string pattern = "/tmp/gradscope-test-XXXXXX";
    if (!::mkdtemp(pattern.data())) throw std::runtime_error("mkdtemp failed");
    path_ = pattern;
  }
  ~TempDir() {
    ::nftw(
        path_.c_str(),
        [](const char* p, const struct stat*, int, struct FTW*) { return std::remove(p); }, 16,
        FTW_DEPTH | FTW_PHYS);
  }
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

}  // namespace gradscope::testing

#include "reports/atomic_file.h"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <stdexcept>

namespace gradscope::report {

void write_file_atomically(const std::string& path, const std::string& content) {
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) {
      throw std::runtime_error("cannot write " + path + ": " + std::strerror(errno));
    }
    out << content;
    out.flush();
    if (!out) {
      std::remove(tmp.c_str());
      throw std::runtime_error("cannot write " + path + ": write failed");
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string reason = std::strerror(errno);
    std::remove(tmp.c_str());
    throw std::runtime_error("cannot write " + path + ": " + reason);
  }
}

}  // namespace gradscope::report

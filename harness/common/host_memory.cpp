#include "harness/common/host_memory.h"

#include <unistd.h>

#include <cstdio>

namespace gradscope {

double host_memory_bytes() {
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? static_cast<double>(pages) * static_cast<double>(page) : 0;
}

std::string format_gib(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f GiB", bytes / double(int64_t{1} << 30));
  return buf;
}

}  // namespace gradscope

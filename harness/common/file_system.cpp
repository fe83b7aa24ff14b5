#include "harness/common/file_system.h"

#include <dirent.h>
#include <ftw.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>

namespace gradscope::files {
namespace {

template <typename Visit>
void for_each_entry(const std::string& dir, Visit visit) {
  DIR* d = ::opendir(dir.c_str());
  if (!d) return;
  while (const dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name != "." && name != "..") visit(name, dir + "/" + name);
  }
  ::closedir(d);
}

}  // namespace

bool is_directory(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

bool is_regular_file(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

bool exists(const std::string& path) {
  struct stat st {};
  return ::lstat(path.c_str(), &st) == 0;
}

void make_directory(const std::string& path) {
  if (::mkdir(path.c_str(), 0777) != 0) {
    throw std::runtime_error(path + ": cannot create the folder: " + std::strerror(errno));
  }
}

std::vector<std::string> subdirectories(const std::string& dir) {
  std::vector<std::string> names;
  for_each_entry(dir, [&](const std::string& name, const std::string& path) {
    if (is_directory(path)) names.push_back(name);
  });
  std::sort(names.begin(), names.end());
  return names;
}

std::vector<std::string> find_files(const std::string& dir, const std::string& suffix) {
  std::vector<std::string> found;
  for_each_entry(dir, [&](const std::string& name, const std::string& path) {
    if (is_directory(path)) {
      const auto inner = find_files(path, suffix);
      found.insert(found.end(), inner.begin(), inner.end());
    } else if (is_regular_file(path) && name.size() >= suffix.size() &&
               name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0) {
      found.push_back(path);
    }
  });
  std::sort(found.begin(), found.end());
  return found;
}

std::string parent_directory(const std::string& path) {
  const auto slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

std::string make_temp_dir(const std::string& prefix) {
  const char* tmp = std::getenv("TMPDIR");
  std::string templ = std::string(tmp && *tmp ? tmp : "/tmp") + "/" + prefix + "-XXXXXX";
  if (!mkdtemp(templ.data())) {
    throw std::runtime_error("cannot create a scratch folder " + templ + ": " +
                             std::strerror(errno));
  }
  return templ;
}

void remove_tree(const std::string& dir) {
  // Depth first, links not followed: files and folders go before the folder holding them.
  ::nftw(
      dir.c_str(),
      [](const char* p, const struct stat*, int, struct FTW*) { return std::remove(p); }, 16,
      FTW_DEPTH | FTW_PHYS);
}

}  // namespace gradscope::files

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
#include <map>
#include <stdexcept>
#include <utility>

#include "harness/common/input_error.h"

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

namespace {

struct Walker {
  std::string suffix;
  bool recursive;
  std::map<std::pair<dev_t, ino_t>, std::string> folders;  // each folder walked, by identity
  std::vector<std::string> found;

  bool wanted(const std::string& name) const {
    return name.size() >= suffix.size() &&
           name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
  }

  void folder(const std::string& dir, const struct stat& st) {
    const auto [it, fresh] = folders.emplace(std::make_pair(st.st_dev, st.st_ino), dir);
    if (!fresh) {
      throw InputError(dir + ": leads back to the folder " + it->second +
                       " (a link to a folder already walked); folder links may not form loops");
    }
    DIR* d = ::opendir(dir.c_str());
    if (!d) throw InputError(dir + ": cannot list the folder: " + std::strerror(errno));
    std::vector<std::string> names;
    while (const dirent* e = ::readdir(d)) {
      const std::string name = e->d_name;
      if (name != "." && name != "..") names.push_back(name);
    }
    ::closedir(d);
    std::sort(names.begin(), names.end());
    for (const auto& name : names) entry(dir + "/" + name, name);
  }

  void entry(const std::string& path, const std::string& name) {
    struct stat link {};
    if (::lstat(path.c_str(), &link) != 0) return;  // gone while walking
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0) {
      if (wanted(name)) {
        throw InputError(path + ": " +
                         (S_ISLNK(link.st_mode) ? std::string("a symbolic link to nothing")
                                                : std::string(std::strerror(errno))));
      }
      return;
    }
    if (S_ISDIR(st.st_mode)) {
      if (recursive) folder(path, st);
    } else if (wanted(name)) {
      if (!S_ISREG(st.st_mode)) {
        throw InputError(path + ": " + kind_of(st.st_mode) + ", not a regular file");
      }
      found.push_back(path);
    }
  }
};

}  // namespace

std::vector<std::string> find_files(const std::string& dir, const std::string& suffix, Walk how) {
  Walker walk{suffix, how == Walk::kRecursive, {}, {}};
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    throw InputError(dir + ": not a folder");
  }
  walk.folder(dir, st);
  std::sort(walk.found.begin(), walk.found.end());
  return walk.found;
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

StagedFolder::StagedFolder(std::string target) : target_(std::move(target)) {
  // "DIR/" names the folder DIR: the temporary goes beside it, not inside it.
  while (target_.size() > 1 && target_.back() == '/') target_.pop_back();
  if (exists(target_)) throw InputError(target_ + ": exists; give a new folder");
  temp_ = target_ + ".tmp.XXXXXX";
  if (::mkdtemp(temp_.data()) == nullptr) {
    throw InputError("cannot create a folder next to " + target_ + ": " + std::strerror(errno));
  }
  // mkdtemp makes it 0700; the finished folder gets what mkdir would have given it.
  const mode_t mask = ::umask(0);
  ::umask(mask);
  ::chmod(temp_.c_str(), 0777 & ~mask);
}

StagedFolder::~StagedFolder() {
  if (!committed_) remove_tree(temp_);
}

void StagedFolder::commit() {
  if (exists(target_)) throw InputError(target_ + ": appeared while it was written");
  if (::rename(temp_.c_str(), target_.c_str()) != 0) {
    throw InputError("cannot create " + target_ + ": " + std::strerror(errno));
  }
  committed_ = true;
}

}  // namespace gradscope::files

#include "reports/output_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <mutex>

namespace gradscope::report {
namespace {

std::string reason(int error) {
  return std::strerror(error);
}

std::string parent_of(const std::string& path) {
  const auto slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

// Temporaries alive now, for the signal handler: fixed slots, so that the handler touches
// no allocator and no lock (unlink is async-signal-safe).
struct Slot {
  std::atomic<bool> live{false};
  char path[4096] = {};
};
std::array<Slot, 32> g_slots;
std::mutex g_slots_mutex;  // between threads registering; the handler only reads

extern "C" void remove_temporaries_and_reraise(int signal) {
  for (auto& slot : g_slots) {
    if (slot.live.load(std::memory_order_acquire)) ::unlink(slot.path);
  }
  std::signal(signal, SIG_DFL);
  std::raise(signal);
}

// Handlers for the signals that end a run from outside, SIGPIPE among them (a closed pipe on
// standard output); a signal the process was told to ignore (nohup's SIGHUP, Python's
// SIGPIPE) stays ignored, and a handler someone else installed stays.
void install_handlers_once() {
  static std::once_flag once;
  std::call_once(once, [] {
    for (int signal : {SIGINT, SIGTERM, SIGHUP, SIGPIPE}) {
      struct sigaction current {};
      if (::sigaction(signal, nullptr, &current) != 0 || current.sa_handler != SIG_DFL) continue;
      struct sigaction handler {};
      handler.sa_handler = remove_temporaries_and_reraise;
      sigemptyset(&handler.sa_mask);
      ::sigaction(signal, &handler, nullptr);
    }
  });
}

int register_temporary(const std::string& path) {
  if (path.size() >= sizeof(Slot::path)) return -1;
  const std::lock_guard<std::mutex> lock(g_slots_mutex);
  for (size_t i = 0; i < g_slots.size(); ++i) {
    if (!g_slots[i].live.load(std::memory_order_relaxed)) {
      std::memcpy(g_slots[i].path, path.c_str(), path.size() + 1);
      g_slots[i].live.store(true, std::memory_order_release);
      return static_cast<int>(i);
    }
  }
  return -1;  // more than 32 at once: still removed on errors, not on a signal
}

void unregister_temporary(const std::string& path) {
  const std::lock_guard<std::mutex> lock(g_slots_mutex);
  for (auto& slot : g_slots) {
    if (slot.live.load(std::memory_order_relaxed) && path == slot.path) {
      slot.live.store(false, std::memory_order_release);
    }
  }
}

void write_all(int fd, std::string_view bytes, const std::string& path) {
  while (!bytes.empty()) {
    const ssize_t n = ::write(fd, bytes.data(), bytes.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) throw OutputError("cannot write " + path + ": " + reason(n < 0 ? errno : EIO));
    bytes.remove_prefix(static_cast<size_t>(n));
  }
}

}  // namespace

OutputTarget output_target(const std::string& path) {
  if (path.empty()) throw OutputError("an output path is empty");
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0) {
    if (S_ISREG(st.st_mode)) return OutputTarget::kRegularFile;
    if (S_ISCHR(st.st_mode) || S_ISFIFO(st.st_mode)) return OutputTarget::kStream;
    throw OutputError("cannot write " + path + ": " +
                      (S_ISDIR(st.st_mode) ? "it is a folder" : "not a regular file or a device"));
  }
  if (errno != ENOENT) throw OutputError("cannot write " + path + ": " + reason(errno));
  const std::string parent = parent_of(path);
  if (::stat(parent.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    throw OutputError("cannot write " + path + ": folder " + parent + " does not exist");
  }
  return OutputTarget::kRegularFile;
}

StagedFile::StagedFile(std::string target) : target_(std::move(target)) {
  if (output_target(target_) != OutputTarget::kRegularFile) {
    throw OutputError("cannot write " + target_ + " through a temporary: not a regular file");
  }
  install_handlers_once();
  const auto slash = target_.find_last_of('/');
  const std::string name = slash == std::string::npos ? target_ : target_.substr(slash + 1);
  const std::string folder = slash == std::string::npos ? "" : target_.substr(0, slash + 1);
  std::string pattern = folder + "." + name + ".tmp.XXXXXX";
  fd_ = ::mkstemp(pattern.data());
  if (fd_ < 0) throw OutputError("cannot write " + target_ + ": " + reason(errno));
  temp_ = pattern;
  register_temporary(temp_);
}

StagedFile::~StagedFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_) {
    ::unlink(temp_.c_str());
    unregister_temporary(temp_);
  }
}

void StagedFile::write(std::string_view bytes) {
  if (fd_ < 0) throw OutputError("cannot write " + target_ + ": already closed");
  write_all(fd_, bytes, target_);
}

void StagedFile::commit() {
  if (fd_ >= 0) {
    // mkstemp creates 0600; a report is as readable as any file the user creates.
    const mode_t mask = ::umask(0);
    ::umask(mask);
    ::fchmod(fd_, 0666 & ~mask);
    const int fd = fd_;
    fd_ = -1;
    if (::close(fd) != 0) throw OutputError("cannot write " + target_ + ": " + reason(errno));
  }
  if (::rename(temp_.c_str(), target_.c_str()) != 0) {
    throw OutputError("cannot write " + target_ + ": " + reason(errno));
  }
  committed_ = true;
  unregister_temporary(temp_);
}

void write_output_file(const std::string& path, std::string_view content) {
  if (output_target(path) == OutputTarget::kStream) {
    const int fd = ::open(path.c_str(), O_WRONLY | O_NOCTTY | O_CLOEXEC);
    if (fd < 0) throw OutputError("cannot write " + path + ": " + reason(errno));
    try {
      write_all(fd, content, path);
    } catch (...) {
      ::close(fd);
      throw;
    }
    if (::close(fd) != 0) throw OutputError("cannot write " + path + ": " + reason(errno));
    return;
  }
  StagedFile staged(path);
  staged.write(content);
  staged.commit();
}

}  // namespace gradscope::report

// Every file gradscope writes goes through here (docs/reports.md, "Output files").
// - A regular file, or a path that does not exist yet, appears whole or not at all: the
//   content goes to a temporary created exclusively (mkstemp: O_EXCL, an unpredictable name)
//   in the target's folder, every write and the close are checked, and the temporary is
//   renamed over the target. On an error, and on SIGINT, SIGTERM, SIGHUP or SIGPIPE (the
//   reader of standard output went away: `gradscope run ... | head`), the temporary is removed.
// - A character device or a FIFO (/dev/null, /dev/stdout, a pipe) is written through, never
//   replaced.
// - Anything else (a folder, a socket, a missing folder) is refused.
// Failures throw OutputError naming the path and the reason ("No space left on device").
#pragma once

#include <stdexcept>
#include <string>
#include <string_view>

namespace gradscope::report {

class OutputError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

enum class OutputTarget { kRegularFile, kStream };

// What writing `path` would do; OutputError when it cannot be written at all.
OutputTarget output_target(const std::string& path);

// A temporary next to a regular target, renamed over it by commit(). Destroyed uncommitted
// (an exception, an early return), it removes the temporary.
class StagedFile {
 public:
  explicit StagedFile(std::string target);
  ~StagedFile();
  StagedFile(const StagedFile&) = delete;
  StagedFile& operator=(const StagedFile&) = delete;

  const std::string& target() const { return target_; }
  // Where to write: libraries that open files by name (HDF5) open this one.
  const std::string& temp_path() const { return temp_; }
  // Appends through the open descriptor; OutputError on a short or failed write.
  void write(std::string_view bytes);
  // Closes (checked) and renames over the target.
  void commit();

 private:
  std::string target_, temp_;
  int fd_ = -1;
  bool committed_ = false;
};

// `content` into `path` as described above.
void write_output_file(const std::string& path, std::string_view content);

}  // namespace gradscope::report

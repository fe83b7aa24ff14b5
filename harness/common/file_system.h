// The few file-system queries the harness needs, on POSIX calls.
// Why not std::filesystem: the PyPI libtorch.so exports its own copies of
// std::filesystem::status, absolute, create_directories, remove_all and others;
// at run time they can shadow libstdc++'s and crash (seen on both machines), so
// code linked with torch avoids them.
#pragma once

#include <sys/stat.h>

#include <string>
#include <vector>

namespace gradscope::files {

// What a non-regular file is, for messages ("a FIFO"); header-only, so that the torch-free
// readers (harness/common/json_input) name file kinds the same way.
inline const char* kind_of(mode_t mode) {
  if (S_ISDIR(mode)) return "a folder";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

bool is_directory(const std::string& path);
bool is_regular_file(const std::string& path);
// Whether anything (a file, folder, link or device) is at `path`.
bool exists(const std::string& path);
// Creates the folder `path` (its parent must exist); throws a runtime_error naming it.
void make_directory(const std::string& path);
// Names of the folders directly inside `dir`, sorted.
std::vector<std::string> subdirectories(const std::string& dir);
// Paths of the files under `dir` (recursively) whose names end in `suffix`, sorted, by the one
// rule of every folder walk (docs/cli.md, "What gradscope refuses"): a link to a file or a
// folder is followed, but each folder is walked once, so a link back up (`up -> ..`) or a
// second way into a folder is refused naming it; an entry whose name ends in `suffix` must be
// a regular file (not a FIFO, a device or a dangling link); other entries are not looked at.
// Throws InputError naming the entry. kTopLevel looks at `dir`'s own entries only.
enum class Walk { kRecursive, kTopLevel };
std::vector<std::string> find_files(const std::string& dir, const std::string& suffix,
                                    Walk walk = Walk::kRecursive);
// The folder a path names a file in ("." for a bare file name).
std::string parent_directory(const std::string& path);
// A new private folder under $TMPDIR (or /tmp) named <prefix>-XXXXXX; throws on failure.
std::string make_temp_dir(const std::string& prefix);
// Removes `dir` and everything below it (symbolic links themselves, not their targets).
void remove_tree(const std::string& dir);

// A new folder that appears whole or not at all (export's checkpoint, sample's case files):
// filled under an unpredictable temporary name next to `target` (created exclusively, with
// the permissions a plain mkdir would give), renamed to `target` by commit(). Destroyed
// uncommitted (an exception: a full disk, a refused input), it removes the temporary.
class StagedFolder {
 public:
  // Throws InputError when `target` exists or no folder can be created next to it.
  explicit StagedFolder(std::string target);
  ~StagedFolder();
  StagedFolder(const StagedFolder&) = delete;
  StagedFolder& operator=(const StagedFolder&) = delete;

  // Where to write the folder's files.
  const std::string& path() const { return temp_; }
  void commit();

 private:
  std::string target_, temp_;
  bool committed_ = false;
};

}  // namespace gradscope::files

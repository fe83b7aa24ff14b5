// libFuzzer target: bytes as a small folder tree, walked as a suite folder is (find_files,
// harness/common/file_system.h). Each 3-byte instruction makes one entry in one of four folders:
// a folder, a regular .toml file, a FIFO, or a symbolic link to another entry, a parent (..),
// itself, or a missing name. The walk must end, return only regular files, and refuse loops and
// entries that are not files with an InputError; anything else is a finding.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "fuzz_scratch.h"
#include "harness/common/file_system.h"
#include "harness/common/input_error.h"

namespace {

const char* kFolders[] = {"", "/a", "/a/b", "/c"};
const char* kNames[] = {"x.toml", "y.toml", "d", "e", "z.txt", "w.toml"};
const char* kTargets[] = {"..", ".", "../..", "missing.toml", "d", "x.toml", "/dev/null", "a"};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string root = [] {
    const std::string r = gradscope::fuzzing::scratch_path("walk");
    ::mkdir(r.c_str(), 0700);
    return r;
  }();
  // Three levels down from the scratch root, so that no link (at most two levels up from a
  // folder of the tree) leads out of it: the walk sees only what the input made.
  const std::string dir = root + "/t/u/v";
  gradscope::files::remove_tree(root + "/t");
  for (const char* level : {"/t", "/t/u", "/t/u/v"}) ::mkdir((root + level).c_str(), 0700);
  for (size_t i = 0; i + 3 <= size && i < 3 * 64; i += 3) {
    const std::string folder = dir + kFolders[data[i] % 4];
    const std::string path = folder + "/" + kNames[data[i + 1] % 6];
    switch (data[i + 2] % 4) {
      case 0:
        ::mkdir(path.c_str(), 0700);
        break;
      case 1: {
        // O_EXCL: never opened over an entry made before (a FIFO would block the open).
        const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NONBLOCK, 0600);
        if (fd >= 0) ::close(fd);
        break;
      }
      case 2:
        ::mkfifo(path.c_str(), 0600);
        break;
      default:
        [[maybe_unused]] const int rc = ::symlink(kTargets[(data[i + 2] / 4) % 8], path.c_str());
        break;
    }
  }
  for (const auto walk : {gradscope::files::Walk::kRecursive, gradscope::files::Walk::kTopLevel}) {
    try {
      for (const auto& f : gradscope::files::find_files(dir, ".toml", walk)) {
        if (!gradscope::files::is_regular_file(f)) std::abort();  // only regular files
      }
    } catch (const gradscope::InputError&) {
    }
  }
  return 0;
}

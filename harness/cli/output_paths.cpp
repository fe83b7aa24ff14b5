#include "harness/cli/output_paths.h"

#include <sys/stat.h>

#include <climits>
#include <cstdlib>

#include "harness/checkpoint/gptq_config.h"
#include "harness/common/file_system.h"
#include "harness/common/input_error.h"
#include "reports/output_file.h"

namespace gradscope {
namespace {

// The absolute name `path` has once its folder is resolved (symlinks, ".", ".."), so that two
// spellings of one file compare equal; the path itself when its folder does not resolve.
std::string resolved_name(const std::string& path) {
  const auto slash = path.find_last_of('/');
  const std::string folder = slash == std::string::npos ? "."
                             : slash == 0               ? "/"
                                                        : path.substr(0, slash);
  const std::string name = slash == std::string::npos ? path : path.substr(slash + 1);
  char buf[PATH_MAX];
  if (::realpath(folder.c_str(), buf) == nullptr) return path;
  const std::string dir = buf;
  if (name.empty() || name == ".") return dir;
  return (dir == "/" ? "" : dir) + "/" + name;
}

bool same_file(const std::string& a, const std::string& b) {
  struct stat sa {
  }, sb{};
  if (::stat(a.c_str(), &sa) == 0 && ::stat(b.c_str(), &sb) == 0) {
    return sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
  }
  return resolved_name(a) == resolved_name(b);
}

}  // namespace

void check_outputs(const std::vector<NamedPath>& outputs, const std::vector<NamedPath>& inputs,
                   const std::string& checkpoint_dir) {
  std::vector<NamedPath> files_so_far;
  for (const auto& out : outputs) {
    if (out.path.empty()) continue;
    if (out.path == "-") {
      throw InputError(out.flag +
                       " -: standard output carries the console report; name a file "
                       "(/dev/stdout writes through)");
    }
    report::OutputTarget target;
    try {
      target = report::output_target(out.path);
    } catch (const report::OutputError& e) {
      throw InputError(out.flag + " " + out.path + ": " + e.what());
    }
    if (target == report::OutputTarget::kStream) continue;  // /dev/null twice is fine
    for (const auto& earlier : files_so_far) {
      if (same_file(earlier.path, out.path)) {
        throw InputError(out.flag + " " + out.path + ": the same file as " + earlier.flag);
      }
    }
    for (const auto& in : inputs) {
      if (!in.path.empty() && same_file(in.path, out.path)) {
        throw InputError(out.flag + " " + out.path + ": is an input of this run (" + in.flag + ")");
      }
    }
    if (!checkpoint_dir.empty()) {
      char buf[PATH_MAX];
      const std::string dir = ::realpath(checkpoint_dir.c_str(), buf) ? buf : checkpoint_dir;
      const std::string resolved = resolved_name(out.path);
      if (resolved.rfind(dir + "/", 0) == 0) {
        const std::string name = resolved.substr(dir.size() + 1);
        if (files::exists(out.path)) {
          throw InputError(out.flag + " " + out.path + ": would replace a file of the checkpoint " +
                           checkpoint_dir + " this command reads");
        }
        if (checkpoint_reads_name(name)) {
          throw InputError(out.flag + " " + out.path + ": the checkpoint reader reads " + name +
                           " in " + checkpoint_dir +
                           "; an output there would be read as part "
                           "of the checkpoint next time");
        }
      }
    }
    files_so_far.push_back(out);
  }
}

}  // namespace gradscope

// The files a command writes, checked before it does any work (docs/cli.md, "What gradscope
// refuses"). Errors are InputErrors naming the flag.
#pragma once

#include <string>
#include <vector>

namespace gradscope {

// A path a command reads or writes, with the flag that named it (for messages).
struct NamedPath {
  std::string flag, path;
};

// Every output a command will write, checked before any work: writable (a file in an
// existing folder, or a device or pipe written through: reports/output_file.h), not "-",
// no two outputs on one file, no output on one of the command's inputs, none replacing a
// file of a checkpoint folder it reads.
void check_outputs(const std::vector<NamedPath>& outputs, const std::vector<NamedPath>& inputs,
                   const std::string& checkpoint_dir = "");

}  // namespace gradscope

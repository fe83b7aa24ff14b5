// Output files appear whole or not at all: content goes to a temporary file in
// the same folder and is renamed over the target once complete.
#pragma once

#include <string>

namespace gradscope::report {

// Throws std::runtime_error naming the path if it cannot be written.
void write_file_atomically(const std::string& path, const std::string& content);

}  // namespace gradscope::report

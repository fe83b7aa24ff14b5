// TOML as gradscope reads every TOML file a user hands it (case files, model-family
// declarations): the characters the TOML library mis-handles refused before it sees them,
// and each error an InputError naming the file, line and column.
#pragma once

#include <string>
#include <string_view>

#include "harness/spec/toml_library.h"

namespace gradscope {

toml::table parse_toml_text(std::string_view text, const std::string& path);

// The file at `path`, which must be a regular file; `what` names it in errors ("case file").
toml::table read_toml_file(const std::string& path, const std::string& what);

}  // namespace gradscope

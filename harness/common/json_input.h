// JSON that gradscope reads from users' files (checkpoint configs, safetensors headers and
// indexes, --against reports), parsed in one place with one set of refusals (docs/cli.md,
// "What gradscope refuses"): what the JSON grammar allows but a reader would take one way
// when the writer meant another. Torch-free: the safetensors container uses it.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <string_view>

namespace gradscope {

// Deeper nesting is refused: gradscope's own files nest four levels, and a value nested a
// hundred thousand deep overflowed the stack of every recursive walk of it.
inline constexpr int kMaxJsonDepth = 64;

// Parses `text`; `source` names it in errors ("C/config.json", "C/a.safetensors: header").
// Throws InputError for malformed JSON, nesting deeper than kMaxJsonDepth, an object that
// names a key twice (readers disagree on which one wins), and a key or string holding U+0000
// (a file name would end there).
nlohmann::json parse_json_input(std::string_view text, const std::string& source);

// The same for a file, which must be a regular file (a FIFO would block the open, a device
// never ends); `what` says what the file is for ("--against", "checkpoint config").
nlohmann::json read_json_input_file(const std::string& path);

// An integer in [lo, hi]: a JSON integer (not a float, not a string) that fits, or InputError
// naming `where` and the range. No value is narrowed silently (2^32 + 4 is not 4).
int64_t json_integer(const nlohmann::json& value, const std::string& where, int64_t lo, int64_t hi);

// A short rendering of a value for an error message: at most 80 characters, never recursive
// past kMaxJsonDepth.
std::string json_excerpt(const nlohmann::json& value);

}  // namespace gradscope

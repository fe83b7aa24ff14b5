#include "harness/spec/toml_text.h"

#include <cstdio>
#include <fstream>
#include <iterator>

#include "harness/common/file_system.h"
#include "harness/common/input_error.h"

namespace gradscope {
namespace {

// toml++ 3.3.0 (Debian's) reaches __builtin_unreachable() in its whitespace table for
// some non-ASCII code points outside strings (found by the case-file fuzzer; input "[\u03FC").
// Until a fixed release is packaged, the text is refused before toml++ sees it.
bool toml_whitespace_table_hole(char32_t c) {
  // Its table buckets U+00A0..U+FEFF by 0x3FA; buckets 0, 11 and 63 list one code point
  // each and fall into the unreachable branch for every other.
  return (c >= 0xA1 && c < 0x49A) || (c >= 0x2C5E && c < 0x3058 && c != 0x3000) ||
         (c >= 0xFB26 && c < 0xFEFF);
}

// TOML allows no control character but tab, newline and carriage return anywhere, comments
// and strings included: refused here with the line and column, whatever toml++ would say.
bool toml_forbidden_control(unsigned char c) {
  return (c < 0x20 && c != '\t' && c != '\n' && c != '\r') || c == 0x7F;
}

// toml++ 3.3.0 scans a value that may be a number or a date ahead by up to 127 characters and
// then steps back over them, but counts an underscore as scanned without keeping it: a
// date-like value padded with a hundred underscores steps back further than its history holds
// (an assertion inside a noexcept function; with NDEBUG, wrong characters read back). No
// case-file value needs more than a few underscores in a row of non-blank characters.
constexpr int kMaxUnderscoresPerWord = 32;

void refuse_unsafe_characters(std::string_view text, const std::string& path) {
  int line = 1, column = 1, underscores = 0;
  for (size_t i = 0; i < text.size(); ++column) {
    const auto lead = static_cast<unsigned char>(text[i]);
    const size_t length = lead < 0x80 ? 1 : lead >= 0xF0 ? 4 : lead >= 0xE0 ? 3 : 2;
    if (lead == '\n') {
      ++line;
      column = 0;
    }
    underscores = lead == ' ' || lead == '\t' || lead == '\n' ? 0 : underscores + (lead == '_');
    if (underscores > kMaxUnderscoresPerWord) {
      throw InputError(path + ":" + std::to_string(line) + ":" + std::to_string(column) +
                       ": more than " + std::to_string(kMaxUnderscoresPerWord) +
                       " underscores in one word (the TOML library mis-scans such values)");
    }
    if (toml_forbidden_control(lead)) {
      char code[16];
      std::snprintf(code, sizeof code, "U+%04X", static_cast<unsigned>(lead));
      throw InputError(path + ":" + std::to_string(line) + ":" + std::to_string(column) +
                       ": control character " + code +
                       " (TOML allows only tab, newline and "
                       "carriage return)");
    }
    if (length > 1 && lead >= 0xC2 && i + length <= text.size()) {
      char32_t c = lead & (0xFF >> (length + 1));
      for (size_t k = 1; k < length; ++k) c = (c << 6) | (text[i + k] & 0x3F);
      if (toml_whitespace_table_hole(c)) {
        char code[16];
        std::snprintf(code, sizeof code, "U+%04X", static_cast<unsigned>(c));
        throw InputError(path + ":" + std::to_string(line) + ":" + std::to_string(column) +
                         ": character " + code +
                         " is not accepted in case files (the TOML library mis-handles it)");
      }
    }
    i += length;
  }
}

}  // namespace

toml::table parse_toml_text(std::string_view text, const std::string& path) {
  refuse_unsafe_characters(text, path);
  try {
    return toml::parse(text, path);
  } catch (const toml::parse_error& e) {
    throw InputError(path + ":" + std::to_string(e.source().begin.line) + ":" +
                     std::to_string(e.source().begin.column) +
                     ": malformed TOML: " + std::string(e.description()));
  } catch (const TomlPreconditionFailed& e) {
    throw InputError(path + ": malformed TOML (the TOML library stopped at its check '" +
                     std::string(e.what()) + "')");
  }
}

toml::table read_toml_file(const std::string& path, const std::string& what) {
  if (!files::is_regular_file(path)) {
    throw InputError(path +
                     (files::exists(path) ? ": not a regular file" : ": " + what + " not found"));
  }
  std::ifstream in(path, std::ios::binary);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (!in && !in.eof()) throw InputError(path + ": cannot read the " + what);
  return parse_toml_text(text, path);
}

}  // namespace gradscope

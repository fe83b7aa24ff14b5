// Text for XML and HTML: the five special characters escaped, and the control
// characters XML 1.0 forbids dropped (tab, newline and carriage return are kept).
#pragma once

#include <string>

namespace gradscope::report {

inline std::string escape_markup(const std::string& text) {
  std::string out;
  for (char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&apos;";
        break;
      default:
        if (static_cast<unsigned char>(c) >= 0x20 || c == '\t' || c == '\n' || c == '\r') out += c;
    }
  }
  return out;
}

}  // namespace gradscope::report

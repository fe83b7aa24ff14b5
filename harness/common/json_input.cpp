#include "harness/common/json_input.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <set>
#include <vector>

#include "harness/common/file_system.h"
#include "harness/common/input_error.h"

namespace gradscope {
namespace {

using nlohmann::json;

// Thrown from the parser callback; turned into an InputError naming the source.
struct Refused {
  std::string why;
};

bool holds_nul(const std::string& s) {
  return s.find('\0') != std::string::npos;
}

std::string quoted_excerpt(const std::string& s) {
  std::string out;
  for (char c : s.substr(0, 60)) out += c == '\0' ? std::string("\\u0000") : std::string(1, c);
  return "\"" + out + (s.size() > 60 ? "...\"" : "\"");
}

// JSON config files and reports are kilobytes to megabytes.
constexpr off_t kMaxJsonFileBytes = off_t{256} << 20;

}  // namespace

json parse_json_input(std::string_view text, const std::string& source) {
  std::vector<std::set<std::string>> keys;  // the keys seen, per open object
  const json::parser_callback_t check = [&](int depth, json::parse_event_t event,
                                            json& parsed) -> bool {
    switch (event) {
      case json::parse_event_t::object_start:
      case json::parse_event_t::array_start:
        if (depth >= kMaxJsonDepth) {
          throw Refused{"nested deeper than " + std::to_string(kMaxJsonDepth) + " levels"};
        }
        if (event == json::parse_event_t::object_start) keys.emplace_back();
        break;
      case json::parse_event_t::object_end:
        if (!keys.empty()) keys.pop_back();
        break;
      case json::parse_event_t::key: {
        const auto& key = parsed.get_ref<const std::string&>();
        if (holds_nul(key)) throw Refused{"key " + quoted_excerpt(key) + " holds U+0000"};
        if (!keys.empty() && !keys.back().insert(key).second) {
          throw Refused{"key " + quoted_excerpt(key) + " appears twice in one object"};
        }
        break;
      }
      case json::parse_event_t::value:
        if (parsed.is_string() && holds_nul(parsed.get_ref<const std::string&>())) {
          throw Refused{"string " + quoted_excerpt(parsed.get_ref<const std::string&>()) +
                        " holds U+0000"};
        }
        break;
      default:
        break;
    }
    return true;
  };
  try {
    return json::parse(text.begin(), text.end(), check);
  } catch (const Refused& r) {
    throw InputError(source + ": " + r.why);
  } catch (const json::exception& e) {
    throw InputError(source + " is not valid JSON: " + e.what());
  }
}

json read_json_input_file(const std::string& path) {
  struct stat link {};
  if (::lstat(path.c_str(), &link) != 0) throw InputError(path + ": file not found");
  // O_NONBLOCK: opening a FIFO must not wait for a writer; fstat then refuses it.
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    throw InputError(path + (S_ISLNK(link.st_mode) && errno == ENOENT
                                 ? ": a symbolic link to a missing file"
                                 : ": cannot open: " + std::string(std::strerror(errno))));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    const mode_t mode = st.st_mode;
    ::close(fd);
    throw InputError(path + ": " + files::kind_of(mode) + ", not a regular file (a JSON file)");
  }
  if (st.st_size > kMaxJsonFileBytes) {
    ::close(fd);
    throw InputError(path + ": " + std::to_string(st.st_size >> 20) +
                     " MiB, larger than a JSON file gradscope reads (" +
                     std::to_string(kMaxJsonFileBytes >> 20) + " MiB)");
  }
  std::string text(static_cast<size_t>(st.st_size), '\0');
  size_t got = 0;
  while (got < text.size()) {
    const ssize_t n = ::read(fd, text.data() + got, text.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got += static_cast<size_t>(n);
  }
  ::close(fd);
  if (got != text.size()) throw InputError(path + ": cannot read (it changed while read?)");
  return parse_json_input(text, path);
}

int64_t json_integer(const json& value, const std::string& where, int64_t lo, int64_t hi) {
  const std::string range = "[" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
  if (!value.is_number_integer()) {
    throw InputError(where + " must be an integer in " + range + ", got " + json_excerpt(value));
  }
  // nlohmann keeps a non-negative integer as unsigned: compare it as one.
  bool fits;
  if (value.is_number_unsigned()) {
    const uint64_t v = value.get<uint64_t>();
    fits = hi >= 0 && v <= static_cast<uint64_t>(hi) && (lo <= 0 || v >= static_cast<uint64_t>(lo));
  } else {
    const int64_t v = value.get<int64_t>();
    fits = v >= lo && v <= hi;
  }
  if (!fits) throw InputError(where + " is " + value.dump() + ", outside " + range);
  return value.is_number_unsigned() ? static_cast<int64_t>(value.get<uint64_t>())
                                    : value.get<int64_t>();
}

std::string json_excerpt(const json& value) {
  std::string text = value.dump();
  return text.size() > 80 ? text.substr(0, 77) + "..." : text;
}

}  // namespace gradscope

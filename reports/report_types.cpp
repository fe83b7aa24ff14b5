#include "reports/report_types.h"

#include <sstream>

namespace gradscope::report {

std::string format_spec_value(const SpecValue& value) {
  struct Formatter {
    std::string operator()(int64_t v) const { return std::to_string(v); }
    std::string operator()(double v) const {
      std::ostringstream s;
      s << v;
      return s.str();
    }
    std::string operator()(bool v) const { return v ? "true" : "false"; }
    std::string operator()(const std::string& v) const { return v; }
  };
  return std::visit(Formatter{}, value);
}

int64_t RunReport::passed() const {
  int64_t n = 0;
  for (const auto& c : cases) n += c.passed() ? 1 : 0;
  return n;
}

}  // namespace gradscope::report

#include "reports/report_types.h"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <sstream>

#include "common/dtype_table.h"

namespace gradscope::report {

std::string format_spec_value(const SpecValue& value) {
  struct Formatter {
    std::string operator()(int64_t v) const { return std::to_string(v); }
    // The shortest text that reads back as the same double: 1000001 is not "1e+06", and
    // 0.99999999 is not "1" in a message that says the value is out of range.
    std::string operator()(double v) const {
      char buf[32];
      const bool whole = std::abs(v) < 1e15 && v == std::trunc(v);
      const auto r = whole ? std::to_chars(buf, buf + sizeof buf, v, std::chars_format::fixed)
                           : std::to_chars(buf, buf + sizeof buf, v);
      return std::string(buf, r.ptr);
    }
    std::string operator()(bool v) const { return v ? "true" : "false"; }
    std::string operator()(const std::string& v) const { return v; }
  };
  return std::visit(Formatter{}, value);
}

std::string format_number(double value) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g", value);
  return buf;
}

const char* status_name(CheckStatus status) {
  switch (status) {
    case CheckStatus::kPass:
      return "pass";
    case CheckStatus::kFail:
      return "fail";
    case CheckStatus::kOutOfRange:
      return "out_of_range";
  }
  return "fail";
}

const char* outcome_name(Outcome outcome) {
  switch (outcome) {
    case Outcome::kPass:
      return "pass";
    case Outcome::kFail:
      return "fail";
    case Outcome::kInvalid:
      return "invalid";
    case Outcome::kUnsupported:
      return "unsupported";
  }
  return "fail";
}

std::pair<double, double> assert_close_tolerances(const std::string& dtype) {
  // Other types read as fp32, as the comparison's own dtype-unaware callers expect.
  const auto* d = find_dtype(dtype);
  if (!d || !d->floating) d = find_dtype("fp32");
  return {d->rtol, d->atol};
}

std::pair<double, double> assert_close_tolerances(const std::string& a, const std::string& b) {
  const auto ta = assert_close_tolerances(a), tb = assert_close_tolerances(b);
  return ta.first >= tb.first ? ta : tb;
}

int64_t RunReport::passed() const {
  int64_t n = 0;
  for (const auto& c : cases) n += c.passed() ? 1 : 0;
  return n;
}

int64_t RunReport::unsupported() const {
  int64_t n = 0;
  for (const auto& c : cases) n += c.is_unsupported() ? 1 : 0;
  return n;
}

std::string Implementation::describe() const {
  if (ns == "gradscope" && libraries.empty()) return "gradscope (built in)";
  std::string s = ns + " (schema " + std::to_string(schema_version);
  for (const auto& l : libraries) s += "; " + l;
  return s + ")";
}

int64_t RunReport::invalid() const {
  int64_t n = 0;
  for (const auto& c : cases) n += c.invalid() ? 1 : 0;
  return n;
}

}  // namespace gradscope::report

#include "reports/junit_report.h"

#include <sstream>

#include "reports/markup_escape.h"

namespace gradscope::report {
std::string to_junit_xml(const RunReport& report) {
  // A check not judged (out of range) is skipped, not failed: the case is invalid, no verdict.
  const auto failed = [](const Check& check) { return !check.passed && !check.out_of_range; };
  int64_t tests = 0, failures = 0, skipped = 0;
  for (const auto& c : report.cases) {
    tests += static_cast<int64_t>(std::max<size_t>(1, c.checks.size()));
    for (const auto& check : c.checks) {
      failures += failed(check) ? 1 : 0;
      skipped += check.out_of_range ? 1 : 0;
    }
    if (c.checks.empty() && !c.is_unsupported()) ++failures;
    if (c.is_unsupported()) ++skipped;
  }
  std::ostringstream x;
  x << "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
    << "<testsuites name=\"gradscope\" tests=\"" << tests << "\" failures=\"" << failures
    << "\" errors=\"0\" skipped=\"" << skipped << "\">\n";
  for (const auto& c : report.cases) {
    int64_t case_failures = c.checks.empty() && !c.is_unsupported() ? 1 : 0;
    int64_t case_skipped = c.is_unsupported() ? 1 : 0;
    for (const auto& check : c.checks) {
      case_failures += failed(check) ? 1 : 0;
      case_skipped += check.out_of_range ? 1 : 0;
    }
    x << "  <testsuite name=\"" << escape_markup(c.id) << "\" tests=\""
      << std::max<size_t>(1, c.checks.size()) << "\" failures=\"" << case_failures
      << "\" errors=\"0\" skipped=\"" << case_skipped << "\" time=\"" << c.seconds << "\">\n";
    if (c.is_unsupported()) {
      x << "    <testcase classname=\"" << escape_markup(c.id) << "\" name=\"checks\" time=\"0\">\n"
        << "      <skipped message=\"" << escape_markup(c.unsupported) << "\"/>\n    </testcase>\n"
        << "  </testsuite>\n";
      continue;
    }
    if (c.checks.empty()) {
      x << "    <testcase classname=\"" << escape_markup(c.id) << "\" name=\"checks\" time=\"0\">\n"
        << "      <failure message=\"no checks ran\" type=\"gradscope\"/>\n    </testcase>\n";
    }
    for (const auto& check : c.checks) {
      const std::string name =
          check.path.rfind(c.id + "/", 0) == 0 ? check.path.substr(c.id.size() + 1) : check.path;
      x << "    <testcase classname=\"" << escape_markup(c.id) << "\" name=\""
        << escape_markup(name) << "\" time=\"0\"";
      if (check.passed) {
        x << "/>\n";
        continue;
      }
      const std::string first_line = check.failure.substr(0, check.failure.find('\n'));
      if (check.out_of_range) {
        x << ">\n      <skipped message=\"" << escape_markup(first_line)
          << "\"/>\n    </testcase>\n";
        continue;
      }
      x << ">\n      <failure message=\"" << escape_markup(first_line) << "\" type=\"gradscope\">"
        << escape_markup(check.failure + "\nreplay: " + c.replay)
        << "</failure>\n    </testcase>\n";
    }
    x << "  </testsuite>\n";
  }
  x << "</testsuites>\n";
  return x.str();
}

}  // namespace gradscope::report

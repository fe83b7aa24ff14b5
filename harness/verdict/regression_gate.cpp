#include "harness/verdict/regression_gate.h"

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <map>

#include "harness/common/input_error.h"

namespace gradscope {
namespace {

struct Score {
  double value;
  std::string status;
};

// Exact checks score their max_abs; ratio checks err(prod)/err(base) (infinite when the
// baseline is exact and prod is not).
double score(double max_abs, const std::optional<double>& baseline) {
  if (!baseline) return max_abs;
  if (*baseline > 0) return max_abs / *baseline;
  return max_abs > 0 ? std::numeric_limits<double>::infinity() : 0.0;
}

// A number of the report: JSON numbers, or "inf", "-inf", "nan" for the non-finite values
// the writer encodes as strings (null, from reports of older versions, reads as NaN).
double report_number(const nlohmann::json& value, const std::string& where) {
  if (value.is_number()) return value.get<double>();
  if (value.is_null()) return std::numeric_limits<double>::quiet_NaN();
  if (value.is_string()) {
    const auto& s = value.get_ref<const std::string&>();
    if (s == "inf") return std::numeric_limits<double>::infinity();
    if (s == "-inf") return -std::numeric_limits<double>::infinity();
    if (s == "nan") return std::numeric_limits<double>::quiet_NaN();
  }
  throw InputError(where + " is " + value.dump() + "; expected a number, \"inf\" or \"nan\"");
}

std::map<std::string, Score> read_accepted(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw InputError("--against " + path + ": file not found or unreadable");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw InputError("--against " + path + ": not JSON (" + e.what() + ")");
  }
  // Types are checked before any value is read: nlohmann's typed access throws type_error,
  // which is not an InputError (found by tests/fuzz/against_report_fuzzer.cpp).
  if (!j.is_object() || !j.contains("tool") || !j["tool"].is_string() ||
      j["tool"].get<std::string>() != "gradscope" || !j.contains("cases") ||
      !j["cases"].is_array()) {
    throw InputError("--against " + path + ": not a gradscope JSON report (no tool/cases)");
  }
  std::map<std::string, Score> scores;
  for (const auto& c : j["cases"]) {
    if (!c.is_object() || (c.contains("checks") && !c["checks"].is_array())) {
      throw InputError("--against " + path + ": a case is not an object with a checks array");
    }
    for (const auto& check : c.value("checks", nlohmann::json::array())) {
      if (!check.is_object() || !check.contains("path") || !check["path"].is_string() ||
          !check.contains("max_abs")) {
        throw InputError("--against " + path + ": a check lacks a path string or max_abs");
      }
      const std::string name = check["path"].get<std::string>();
      const std::string where = "--against " + path + ": " + name;
      std::optional<double> base;
      if (check.contains("baseline_max_abs") && !check["baseline_max_abs"].is_null()) {
        base = report_number(check["baseline_max_abs"], where + " baseline_max_abs");
      }
      const auto status = check.contains("status") && check["status"].is_string()
                              ? check["status"].get<std::string>()
                              : std::string("?");
      scores[name] = {score(report_number(check["max_abs"], where + " max_abs"), base), status};
    }
  }
  return scores;
}

}  // namespace

int64_t compare_with_accepted(std::ostream& out, const report::RunReport& current,
                              const std::string& accepted_path, double factor) {
  auto accepted = read_accepted(accepted_path);
  int64_t flagged = 0;
  char line[768];
  const auto flag = [&](const std::string& path, const std::string& old_text,
                        const std::string& new_text, const char* why) {
    if (flagged++ == 0) {
      std::snprintf(line, sizeof line,
                    "\nregressions against %s (factor %g):\n  %-70s %14s %14s  %s\n",
                    accepted_path.c_str(), factor, "check", "accepted", "now", "why");
      out << line;
    }
    std::snprintf(line, sizeof line, "  %-70s %14s %14s  %s\n", path.c_str(), old_text.c_str(),
                  new_text.c_str(), why);
    out << line;
  };
  const auto text = [](const Score& s) {
    char buf[40];
    std::snprintf(buf, sizeof buf, "%.4g %s", s.value, s.status.c_str());
    return std::string(buf);
  };
  for (const auto& c : current.cases) {
    for (const auto& check : c.checks) {
      const Score now{score(check.max_abs, check.baseline_max_abs), check.passed ? "pass" : "fail"};
      auto it = accepted.find(check.path);
      if (it == accepted.end()) {
        flag(check.path, "-", text(now), "new check");
        continue;
      }
      const Score old = it->second;
      accepted.erase(it);
      // A score that became NaN (a non-finite error) is a regression; one that was NaN and
      // is a number now is not.
      const bool grew =
          now.value > factor * old.value || (std::isnan(now.value) && !std::isnan(old.value));
      if (grew || (old.status == "pass" && now.status != "pass")) {
        flag(check.path, text(old), text(now),
             now.status != old.status ? "now failing" : "score grew");
      }
    }
  }
  for (const auto& [path, old] : accepted) flag(path, text(old), "-", "missing");
  if (flagged == 0) out << "no regressions against " << accepted_path << "\n";
  return flagged;
}

}  // namespace gradscope

#include "harness/verdict/regression_gate.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <set>

#include "harness/common/input_error.h"
#include "harness/common/json_input.h"

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
  throw InputError(where + " is " + json_excerpt(value) +
                   "; expected a number, \"inf\" or \"nan\"");
}

// The accepted report, read strictly (docs/reports.md, "--against"): every field the gate
// uses must be there with its type, so a malformed report is refused rather than read as an
// empty or a different one.
std::map<std::string, Score> read_accepted(const std::string& path, std::set<std::string>* ids) {
  const std::string at = "--against " + path;
  nlohmann::json j;
  try {
    j = read_json_input_file(path);
  } catch (const InputError& e) {
    throw InputError("--against " + std::string(e.what()));
  }
  // Types are checked before any value is read: nlohmann's typed access throws type_error,
  // which is not an InputError (found by tests/fuzz/against_report_fuzzer.cpp).
  if (!j.is_object() || !j.contains("tool") || !j["tool"].is_string() ||
      j["tool"].get<std::string>() != "gradscope" || !j.contains("cases") ||
      !j["cases"].is_array()) {
    throw InputError(at + ": not a gradscope JSON report (no tool/cases)");
  }
  static const std::set<std::string> kCheckStatuses = {"pass", "fail", "out_of_range"};
  std::map<std::string, Score> scores;
  size_t index = 0;
  for (const auto& c : j["cases"]) {
    const std::string where_case = at + ": cases[" + std::to_string(index++) + "]";
    if (!c.is_object()) throw InputError(where_case + " is not an object");
    if (!c.contains("id") || !c["id"].is_string() ||
        c["id"].get_ref<const std::string&>().empty()) {
      throw InputError(where_case + " has no id string");
    }
    const std::string id = c["id"].get<std::string>();
    if (!ids->insert(id).second) throw InputError(at + ": case '" + id + "' appears twice");
    if (!c.contains("checks") || !c["checks"].is_array()) {
      throw InputError(at + ": case '" + id + "' has no checks array");
    }
    for (const auto& check : c["checks"]) {
      if (!check.is_object() || !check.contains("path") || !check["path"].is_string() ||
          !check.contains("max_abs")) {
        throw InputError(at + ": case '" + id + "': a check lacks a path string or max_abs");
      }
      const std::string name = check["path"].get<std::string>();
      const std::string where = at + ": " + name;
      if (name.compare(0, id.size() + 1, id + "/") != 0) {
        throw InputError(where + ": the path does not start with its case id '" + id + "/'");
      }
      if (!check.contains("status") || !check["status"].is_string() ||
          !kCheckStatuses.count(check["status"].get<std::string>())) {
        throw InputError(where + " status is " +
                         (check.contains("status") ? json_excerpt(check["status"]) : "missing") +
                         "; expected \"pass\", \"fail\" or \"out_of_range\"");
      }
      if (check.contains("exact") && !check["exact"].is_boolean()) {
        throw InputError(where + " exact is " + json_excerpt(check["exact"]) +
                         "; expected true or false");
      }
      std::optional<double> base;
      if (check.contains("baseline_max_abs") && !check["baseline_max_abs"].is_null()) {
        base = report_number(check["baseline_max_abs"], where + " baseline_max_abs");
      }
      const Score score_now{score(report_number(check["max_abs"], where + " max_abs"), base),
                            check["status"].get<std::string>()};
      if (!scores.emplace(name, score_now).second) {
        throw InputError(where + ": the check appears twice");
      }
    }
  }
  return scores;
}

}  // namespace

int64_t compare_with_accepted(std::ostream& out, const report::RunReport& current,
                              const std::string& accepted_path, double factor) {
  std::set<std::string> accepted_ids;
  auto accepted = read_accepted(accepted_path, &accepted_ids);
  std::set<std::string> run_ids;
  for (const auto& c : current.cases) run_ids.insert(c.id);
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
      const Score now{score(check.max_abs, check.baseline_max_abs), check.status()};
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
             now.status == old.status ? "score grew"
             : now.status == "fail"   ? "now failing"
                                      : "now not judged");
      }
    }
  }
  // A check of a case this run did not select (--filter, another suite) is not run, not
  // missing: only a check that disappeared from a case that ran is a regression.
  int64_t not_run = 0;
  for (const auto& entry : accepted) {
    const std::string& path = entry.first;
    const bool case_ran = std::any_of(run_ids.begin(), run_ids.end(), [&](const std::string& id) {
      return path.compare(0, id.size() + 1, id + "/") == 0;
    });
    if (case_ran) {
      flag(path, text(entry.second), "-", "missing");
    } else {
      ++not_run;
    }
  }
  if (not_run > 0) {
    out << not_run << " accepted check" << (not_run == 1 ? "" : "s") << " of "
        << accepted_ids.size() -
               std::count_if(accepted_ids.begin(), accepted_ids.end(),
                             [&](const std::string& id) { return run_ids.count(id) > 0; })
        << " case(s) this run did not select: not run, not compared\n";
  }
  if (flagged == 0) out << "no regressions against " << accepted_path << "\n";
  return flagged;
}

}  // namespace gradscope

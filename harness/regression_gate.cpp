#include "harness/regression_gate.h"

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <map>

#include "harness/input_error.h"

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

std::map<std::string, Score> read_accepted(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw InputError("--against " + path + ": file not found or unreadable");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw InputError("--against " + path + ": not JSON (" + e.what() + ")");
  }
  if (!j.is_object() || j.value("tool", "") != "gradscope" || !j.contains("cases") ||
      !j["cases"].is_array()) {
    throw InputError("--against " + path + ": not a gradscope JSON report (no tool/cases)");
  }
  std::map<std::string, Score> scores;
  for (const auto& c : j["cases"]) {
    for (const auto& check : c.value("checks", nlohmann::json::array())) {
      if (!check.contains("path") || !check.contains("max_abs")) {
        throw InputError("--against " + path + ": a check lacks path or max_abs");
      }
      std::optional<double> base;
      if (check.contains("baseline_max_abs") && check["baseline_max_abs"].is_number()) {
        base = check["baseline_max_abs"].get<double>();
      }
      scores[check["path"].get<std::string>()] = {score(check["max_abs"].get<double>(), base),
                                                  check.value("status", "?")};
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
      if (now.value > factor * old.value || (old.status == "pass" && now.status != "pass")) {
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

#include "reports/model_report.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

#include "reports/markup_escape.h"
#include "reports/report_types.h"

namespace gradscope::report {
namespace {

// JSON has no inf or NaN: the strings "inf", "-inf", "nan", as the run's JSON report writes.
nlohmann::ordered_json model_number(const std::optional<double>& v) {
  if (!v) return nullptr;
  if (std::isnan(*v)) return "nan";
  if (std::isinf(*v)) return *v > 0 ? "inf" : "-inf";
  return *v;
}

// The heatmap's columns: a check's tensor, by how the module's own name for it ends (or, for
// the adapters, what it contains).
struct ModelRole {
  const char* column;
  const char* key;
  bool contains;
};
constexpr ModelRole kModelRoles[] = {
    {"output", "output", false},       {"input.grad", "input.grad", false},
    {"lora_A.grad", ".lora_A.", true}, {"lora_B.grad", ".lora_B.", true},
    {"loss", "loss", false},           {"error", "error", false}};

bool in_model_role(const ModelCheck& k, const ModelRole& role) {
  const std::string key = role.key;
  if (role.contains) return k.name.find(key) != std::string::npos;
  return k.name.size() >= key.size() &&
         k.name.compare(k.name.size() - key.size(), key.size(), key) == 0;
}

// White at 0, through yellow to orange as err/limit nears 1 (1 is the rule's limit); red fails.
std::string model_cell_colour(const std::optional<double>& ratio, bool passed) {
  if (!passed) return "#b2182b";
  if (!ratio) return "#f0f0f0";
  const double r = std::max(0.0, std::min(1.0, *ratio));
  char buf[16];
  std::snprintf(buf, sizeof buf, "#ff%02x%02x", static_cast<int>(255 - 120 * r),
                static_cast<int>(255 - 255 * std::min(1.0, 2 * r)));
  return buf;
}

std::string model_figure(double v, int digits, char style) {
  char buf[64];
  const char format[] = {'%', '.', static_cast<char>('0' + digits), style, '\0'};
  std::snprintf(buf, sizeof buf, format, v);
  return buf;
}

}  // namespace

std::optional<double> ModelCheck::ratio() const {
  if (!value || !limit || *limit == 0) return std::nullopt;
  return *value / *limit;
}

std::string ModelCase::dtype() const {
  const auto first = id.find('.');
  if (first == std::string::npos) return id;
  const auto second = id.find('.', first + 1);
  return id.substr(first + 1, second == std::string::npos ? std::string::npos : second - first - 1);
}

bool ModelReport::passed() const {
  return std::all_of(modules.begin(), modules.end(), [](const auto& m) { return m.passed; });
}

const ModelModule* ModelReport::first_failure() const {
  for (const auto& m : modules) {
    if (!m.passed) return &m;
  }
  return nullptr;
}

std::string model_json(const ModelReport& report) {
  const ModelModule* first = report.first_failure();
  nlohmann::ordered_json not_judged = nlohmann::ordered_json::array();
  nlohmann::ordered_json modules = nlohmann::ordered_json::array();
  for (const auto& m : report.modules) {
    if (m.not_judged) not_judged.push_back(m.path);
    nlohmann::ordered_json cases = nlohmann::ordered_json::array();
    for (const auto& c : m.cases) {
      nlohmann::ordered_json checks = nlohmann::ordered_json::array();
      for (const auto& k : c.checks) {
        checks.push_back({{"name", k.name},
                          {"passed", k.passed()},
                          {"status", k.status},
                          {"statistic", k.statistic},
                          {"max_abs", model_number(k.value)},
                          {"limit", model_number(k.limit)},
                          {"error_to_limit", model_number(k.ratio())},
                          {"message", k.message}});
      }
      cases.push_back(
          {{"id", c.id}, {"status", c.status}, {"replay", c.replay}, {"checks", checks}});
    }
    modules.push_back({{"path", m.path}, {"kind", m.kind}, {"passed", m.passed}, {"cases", cases}});
  }
  const nlohmann::ordered_json j = {
      {"passed", report.passed()},
      {"first_divergence", first ? nlohmann::ordered_json(first->path) : nullptr},
      {"not_judged", not_judged},
      {"note",
       report.note.empty() ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(report.note)},
      {"modules", modules}};
  return j.dump(1) + "\n";
}

std::string model_junit(const ModelReport& report, const std::string& name) {
  std::ostringstream body;
  int64_t tests = 0, failures = 0, skipped = 0;
  for (const auto& m : report.modules) {
    for (const auto& c : m.cases) {
      const std::string dtype = c.dtype();
      if (c.checks.empty()) {  // a case the module declined: a skip, not a silent gap
        ++skipped;
        body << "<testcase classname=\"" << escape_markup(m.path) << "\" name=\""
             << escape_markup(dtype) << ".case\"><skipped message=\""
             << escape_markup(c.status + ": " + c.unsupported) << "\" /></testcase>";
      }
      for (const auto& k : c.checks) {
        body << "<testcase classname=\"" << escape_markup(m.path) << "\" name=\""
             << escape_markup(dtype + "." + k.name) << "\"";
        const std::string first_line = k.message.substr(0, k.message.find('\n'));
        if (!k.judged()) {  // not judged: no verdict, a skip
          ++skipped;
          body << "><skipped message=\"" << escape_markup(first_line) << "\" /></testcase>";
        } else if (!k.passed()) {
          ++failures;
          body << "><failure message=\"" << escape_markup(first_line) << "\">"
               << escape_markup(k.message + "\nreplay: " + c.replay) << "</failure></testcase>";
        } else {
          body << " />";
        }
      }
      tests += static_cast<int64_t>(std::max<size_t>(1, c.checks.size()));
    }
  }
  return "<testsuites><testsuite name=\"" + escape_markup(name) + "\" tests=\"" +
         std::to_string(tests) + "\" failures=\"" + std::to_string(failures) + "\" skipped=\"" +
         std::to_string(skipped) + "\">" + body.str() + "</testsuite></testsuites>\n";
}

std::string model_html(const ModelReport& report, const std::string& title) {
  std::vector<std::string> dtypes;
  for (const auto& m : report.modules) {
    for (const auto& c : m.cases) {
      if (std::find(dtypes.begin(), dtypes.end(), c.dtype()) == dtypes.end()) {
        dtypes.push_back(c.dtype());
      }
    }
  }
  const size_t roles = std::size(kModelRoles);
  std::string head, role_heads;
  for (const auto& d : dtypes) {
    head += "<th colspan=" + std::to_string(roles) + ">" + escape_markup(d) + "</th>";
    for (const auto& r : kModelRoles) role_heads += "<th>" + escape_markup(r.column) + "</th>";
  }
  std::string rows;
  for (const auto& m : report.modules) {
    std::string cells;
    for (const auto& dtype : dtypes) {
      const auto found = std::find_if(m.cases.begin(), m.cases.end(),
                                      [&](const ModelCase& c) { return c.dtype() == dtype; });
      for (const auto& role : kModelRoles) {
        std::vector<const ModelCheck*> checks;
        if (found != m.cases.end()) {
          for (const auto& k : found->checks) {
            if (in_model_role(k, role)) checks.push_back(&k);
          }
        }
        if (checks.empty()) {
          cells += "<td></td>";
          continue;
        }
        std::optional<double> worst;
        bool passed = true, judged = false;
        std::string tip;
        for (const auto* k : checks) {
          const auto ratio = k->ratio();
          if (k->judged() && ratio) worst = std::max(worst.value_or(*ratio), *ratio);
          passed = passed && (k->passed() || !k->judged());
          judged = judged || k->judged();
          tip += (tip.empty() ? "" : "\n") + k->name + ": " +
                 (ratio ? model_figure(*ratio, 3, 'g') : k->status);
        }
        const std::string text = !passed   ? "FAIL"
                                 : !judged ? "not judged"
                                 : worst   ? model_figure(*worst, 2, 'f')
                                           : "";
        cells += "<td style='background:" + model_cell_colour(worst, passed) + "' title='" +
                 escape_markup(tip) + "'>" + text + "</td>";
      }
    }
    rows += "<tr><th>" + escape_markup(m.path) + "</th><td>" + escape_markup(m.kind) + "</td><td>" +
            m.verdict() + "</td>" + cells + "</tr>";
  }
  const ModelModule* first = report.first_failure();
  size_t not_judged = 0;
  for (const auto& m : report.modules) not_judged += m.not_judged ? 1 : 0;
  const std::string summary =
      first ? "first divergence: " + escape_markup(first->path) + " (" +
                  escape_markup(first->kind) + ")"
      : not_judged ? std::to_string(not_judged) + " of " + std::to_string(report.modules.size()) +
                         " modules not judged in some dtype, the others pass"
                   : "all " + std::to_string(report.modules.size()) + " modules pass";
  return "<!DOCTYPE html><html><head><meta charset='utf-8'><title>" + escape_markup(title) +
         "</title><style>body{font-family:sans-serif}table{border-collapse:collapse}"
         "td,th{border:1px solid #ccc;padding:2px 6px;text-align:center;font-size:12px}"
         "tbody th{text-align:left}</style></head><body><h1>" +
         escape_markup(title) + "</h1><p>" + summary +
         ". Each cell: the worst error/limit of the module's checks of that tensor (1 is the "
         "rule's limit); hover for each check.</p><table><thead><tr><th rowspan=2>module</th>"
         "<th rowspan=2>kind</th><th rowspan=2>verdict</th>" +
         head + "</tr><tr>" + role_heads + "</tr></thead><tbody>" + rows +
         "</tbody></table></body></html>\n";
}

}  // namespace gradscope::report

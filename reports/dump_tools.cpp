#include "reports/dump_tools.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <set>

namespace gradscope::report {
namespace {

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

std::string parent(const std::string& path) {
  return path.substr(0, path.find_last_of('/'));
}

std::string join_limited(const std::vector<std::string>& items, size_t limit) {
  std::string s;
  for (size_t i = 0; i < items.size() && i < limit; ++i) s += "\n  " + items[i];
  if (items.size() > limit) s += "\n  ... and " + std::to_string(items.size() - limit) + " more";
  return s;
}

}  // namespace

void show_dump(std::ostream& out, const Dump& dump, const std::string& file,
               const std::string& path_in) {
  std::string path = path_in;
  if (!path.empty() && path[0] != '/') path = "/" + path;
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  const auto selected = [&](const std::string& p) {
    return path.empty() || p == path || p.rfind(path + "/", 0) == 0;
  };
  const bool any = std::any_of(dump.datasets.begin(), dump.datasets.end(),
                               [&](const DumpDataset& d) { return selected(d.path); });
  // The whole of a dump with no tensors (every case passed under --dump-failing-only) is
  // shown as such; only a path that names nothing is an error.
  if (!any && !path.empty()) throw DumpError(file + ": no group or dataset " + path);
  if (path.empty()) {
    out << file << ": gradscope dump";
    for (const auto& [k, v] : dump.attributes) out << (k == "format" ? "" : "\n  " + k + " = " + v);
    out << "\n  cases: " << dump.cases.size() << "\n";
  }
  std::string group;
  char line[512];
  for (const auto& d : dump.datasets) {
    if (!selected(d.path)) continue;
    if (parent(d.path) != group) {
      group = parent(d.path);
      out << group;
      const auto attrs = dump.group_attributes.find(group);
      if (attrs != dump.group_attributes.end()) {
        for (const char* key : {"status", "max_abs", "baseline_max_abs", "limit"}) {
          auto it = attrs->second.find(key);
          if (it != attrs->second.end()) out << "  " << key << "=" << it->second;
        }
      }
      out << "\n";
    }
    double lo = 0, hi = 0, sum = 0, sq = 0;
    if (!d.values.empty()) lo = hi = d.values[0];
    for (double v : d.values) {
      lo = std::min(lo, v);
      hi = std::max(hi, v);
      sum += v;
      sq += v * v;
    }
    const double n = std::max<double>(1, static_cast<double>(d.values.size()));
    std::snprintf(line, sizeof line,
                  "    %-14s %-5s %-16s min %11.4g  max %11.4g  mean %11.4g  norm %11.4g\n",
                  d.path.substr(d.path.find_last_of('/') + 1).c_str(), d.dtype.c_str(),
                  shape_text(d.shape).c_str(), lo, hi, sum / n, std::sqrt(sq));
    out << line;
  }
}

DiffResult diff_dumps(std::ostream& out, const Dump& a, const std::string& a_file, const Dump& b,
                      const std::string& b_file, const DiffOptions& options) {
  const auto only = [](const std::vector<std::string>& x, const std::vector<std::string>& y) {
    std::vector<std::string> r;
    std::set_difference(x.begin(), x.end(), y.begin(), y.end(), std::back_inserter(r));
    return r;
  };
  std::vector<std::string> pa, pb;
  for (const auto& d : a.datasets) pa.push_back(d.path);
  for (const auto& d : b.datasets) pb.push_back(d.path);
  const auto cases_a = only(a.cases, b.cases), cases_b = only(b.cases, a.cases);
  const auto paths_a = only(pa, pb), paths_b = only(pb, pa);
  if (!cases_a.empty() || !cases_b.empty() || !paths_a.empty() || !paths_b.empty()) {
    std::string msg = "the dumps hold different ";
    msg += (!cases_a.empty() || !cases_b.empty()) ? "cases" : "tensors";
    const auto& left = cases_a.empty() && cases_b.empty() ? paths_a : cases_a;
    const auto& right = cases_a.empty() && cases_b.empty() ? paths_b : cases_b;
    if (!left.empty()) msg += "\nonly in " + a_file + ":" + join_limited(left, 20);
    if (!right.empty()) msg += "\nonly in " + b_file + ":" + join_limited(right, 20);
    throw DumpError(msg);
  }

  DiffResult result;
  result.json = {{"a", a_file}, {"b", b_file}};
  auto tensors = nlohmann::ordered_json::array();
  std::string group;
  char line[512];
  for (size_t i = 0; i < a.datasets.size(); ++i) {
    const auto& x = a.datasets[i];
    const auto& y = b.datasets[i];
    const auto [dtype_rtol, dtype_atol] = assert_close_tolerances(x.dtype, y.dtype);
    const double rtol = options.rtol.value_or(dtype_rtol), atol = options.atol.value_or(dtype_atol);
    bool within = x.shape == y.shape;
    double max_abs = 0, sum_abs = 0, diff_sq = 0, ref_sq = 0;
    if (within) {
      for (size_t k = 0; k < x.values.size(); ++k) {
        // Equal values (infinities too) and NaN at the same element on both sides differ by
        // 0; a NaN on one side only differs by NaN, which the max keeps so the line cannot
        // read as a small difference.
        const bool same =
            x.values[k] == y.values[k] || (std::isnan(x.values[k]) && std::isnan(y.values[k]));
        const double d = same ? 0.0 : std::abs(x.values[k] - y.values[k]);
        max_abs = std::isnan(d) || std::isnan(max_abs) ? std::nan("") : std::max(max_abs, d);
        sum_abs += d;
        diff_sq += d * d;
        if (std::isfinite(y.values[k])) ref_sq += y.values[k] * y.values[k];
        within = within && (same || d <= atol + rtol * std::abs(y.values[k]));
      }
    }
    const double mean_abs = x.values.empty() ? 0 : sum_abs / x.values.size();
    const double rel_fro = ref_sq > 0 ? std::sqrt(diff_sq / ref_sq) : std::sqrt(diff_sq);
    ++result.tensors;
    result.differing += within ? 0 : 1;
    if (parent(x.path) != group) {
      group = parent(x.path);
      out << group << "\n";
    }
    const std::string status = x.shape != y.shape ? "SHAPE" : within ? "same" : "DIFFERS";
    std::snprintf(line, sizeof line,
                  "    %-14s max_abs %11.4g  mean_abs %11.4g  rel_fro %11.4g  %s\n",
                  x.path.substr(x.path.find_last_of('/') + 1).c_str(), max_abs, mean_abs, rel_fro,
                  status.c_str());
    out << line;
    tensors.push_back({{"path", x.path},
                       {"dtype", x.dtype},
                       {"max_abs", max_abs},
                       {"mean_abs", mean_abs},
                       {"rel_fro", rel_fro},
                       {"rtol", rtol},
                       {"atol", atol},
                       {"status", within ? "same" : "differs"}});
  }
  out << "\n"
      << result.tensors - result.differing << " same, " << result.differing << " differ (of "
      << result.tensors << " tensors)\n";
  result.json["tensors"] = tensors;
  result.json["summary"] = {{"total", result.tensors},
                            {"same", result.tensors - result.differing},
                            {"differ", result.differing}};
  return result;
}

}  // namespace gradscope::report

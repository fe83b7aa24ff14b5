#include "harness/catalog/case_coverage.h"

#include <functional>
#include <iomanip>
#include <sstream>
#include <stdexcept>
#include <variant>

namespace gradscope {
namespace {

// One type axis of a kind: its required values and how a case's fields name its value.
struct AxisRule {
  std::string name;
  std::vector<std::string> values;
  std::function<std::string(const CaseSpec&)> value_of;
  bool in_pairs = true;
};

// What a kind must reach (docs/coverage.md).
struct KindRule {
  std::string kind;
  std::vector<AxisRule> axes;
  std::function<int64_t(const CaseSpec&)> tokens;  // null: the kind has no token axis
  std::function<std::vector<int64_t>(const CaseSpec&)> features;
};

// Block sizes whose tails are checked: a kernel's tile over tokens or features is one of these.
constexpr int64_t kModuli[] = {2, 4, 8, 16, 32, 64, 128};
// Feature counts are multiples of 32 / bits (at least 4, at 8 bits): residues modulo 2 and 4
// are always 0, so only larger moduli have a non-zero class to reach.
constexpr int64_t kSmallestFeatureStep = 4;

// An axis that is one field: its value as the case file writes it.
AxisRule field_axis(const std::string& field, std::vector<std::string> values) {
  return {field, std::move(values), [field](const CaseSpec& s) -> std::string {
            for (const auto& [name, v] : s.fields()) {
              if (name != field) continue;
              if (const auto* b = std::get_if<bool>(&v)) return *b ? "true" : "false";
              if (const auto* i = std::get_if<int64_t>(&v)) return std::to_string(*i);
              if (const auto* str = std::get_if<std::string>(&v)) return *str;
            }
            throw std::logic_error("coverage: case has no field " + field);
          }};
}

std::vector<AxisRule> gptq_axes() {
  return {field_axis("bits", {"2", "3", "4", "8"}),
          field_axis("format", {"gptq", "gptq_v2"}),
          field_axis("sym", {"true", "false"}),
          {"act_order",
           {"off", "act", "act-static"},
           [](const CaseSpec& s) -> std::string {
             if (!s.get_bool("desc_act")) return "off";
             return s.get_bool("static_groups") ? "act-static" : "act";
           }},
          field_axis("scales_dtype", {"fp16", "bf16"}),
          field_axis("dtype", {"fp32", "fp16", "bf16"})};
}

std::vector<AxisRule> lora_axes() {
  auto axes = gptq_axes();
  axes.push_back(field_axis("adapter_dtype", {"fp32", "fp16", "bf16"}));
  axes.push_back({"dropout", {"0", "p>0"}, [](const CaseSpec& s) -> std::string {
                    return s.get_float("dropout") == 0 ? "0" : "p>0";
                  }});
  axes.push_back(field_axis("bias", {"true", "false"}));
  axes.push_back(field_axis("rslora", {"true", "false"}));
  // Not paired with the type axes: the shape of x, [tokens, in] or [batch, seq, in].
  axes.push_back({"input",
                  {"2-D", "3-D odd seq", "3-D even seq"},
                  [](const CaseSpec& s) -> std::string {
                    if (s.get_int("batch") == 0) return "2-D";
                    return s.get_int("seq") % 2 ? "3-D odd seq" : "3-D even seq";
                  },
                  /*in_pairs=*/false});
  return axes;
}

int64_t lora_tokens(const CaseSpec& s) {
  const int64_t batch = s.get_int("batch");
  return (batch == 0 ? 1 : batch) * s.get_int("seq");
}

const std::vector<KindRule>& kind_rules() {
  static const std::vector<KindRule> rules = [] {
    std::vector<KindRule> r;
    auto dequant = gptq_axes();
    dequant.push_back(field_axis("layout", {"in_out", "out_in"}));
    dequant.push_back(
        {"storage", {"int32", "fp32", "fp16", "bf16"}, field_axis("storage", {}).value_of, false});
    r.push_back({"dequant", dequant, nullptr, [](const CaseSpec& s) {
                   return std::vector<int64_t>{s.get_int("in_features"), s.get_int("out_features")};
                 }});
    r.push_back({"lora_w", lora_axes(), lora_tokens, [](const CaseSpec& s) {
                   return std::vector<int64_t>{s.get_int("in_features"), s.get_int("out_features")};
                 }});
    auto qkv = lora_axes();
    qkv.push_back({"gqa_ratio", {"1", "2", "4"}, [](const CaseSpec& s) {
                     return std::to_string(s.get_int("heads") / s.get_int("kv_heads"));
                   }});
    r.push_back(
        {"qkv", qkv, lora_tokens, [](const CaseSpec& s) {
           const int64_t hidden = s.get_int("hidden");
           return std::vector<int64_t>{hidden, hidden / s.get_int("heads") * s.get_int("kv_heads")};
         }});
    r.push_back({"mlp", lora_axes(), lora_tokens, [](const CaseSpec& s) {
                   return std::vector<int64_t>{s.get_int("hidden"), s.get_int("intermediate")};
                 }});
    return r;
  }();
  return rules;
}

const KindRule* rule_for(const std::string& kind) {
  for (const auto& r : kind_rules()) {
    if (r.kind == kind) return &r;
  }
  return nullptr;
}

std::vector<ResidueCoverage> token_residues(const std::set<int64_t>& counts) {
  std::vector<ResidueCoverage> out;
  for (const int64_t m : kModuli) {
    ResidueCoverage rc{m, {}, {}};
    for (const int64_t c : counts) rc.reached.insert(c % m);
    bool between = false;
    for (const int64_t r : rc.reached) between = between || (r >= 2 && r <= m - 2);
    if (!rc.reached.count(0)) rc.missing.push_back("0");
    if (!rc.reached.count(1)) rc.missing.push_back("1");
    if (m > 2 && !rc.reached.count(m - 1)) rc.missing.push_back("m-1");
    if (m >= 4 && !between) rc.missing.push_back("between");
    out.push_back(std::move(rc));
  }
  return out;
}

std::vector<ResidueCoverage> feature_residues(const std::set<int64_t>& counts) {
  std::vector<ResidueCoverage> out;
  for (const int64_t m : kModuli) {
    ResidueCoverage rc{m, {}, {}};
    bool nonzero = false;
    for (const int64_t c : counts) {
      rc.reached.insert(c % m);
      nonzero = nonzero || c % m != 0;
    }
    if (!rc.reached.count(0)) rc.missing.push_back("0");
    if (m > kSmallestFeatureStep && !nonzero) rc.missing.push_back("not 0");
    out.push_back(std::move(rc));
  }
  return out;
}

KindCoverage measure_kind(const std::string& kind, const std::vector<const CaseSpec*>& cases) {
  KindCoverage kc;
  kc.kind = kind;
  kc.cases = static_cast<int64_t>(cases.size());
  const KindRule* rule = rule_for(kind);
  if (!rule) return kc;
  kc.has_requirements = true;
  // values[c][a]: case c's value on axis a.
  std::vector<std::vector<std::string>> values;
  for (const auto* c : cases) {
    std::vector<std::string> row;
    for (const auto& axis : rule->axes) row.push_back(axis.value_of(*c));
    values.push_back(std::move(row));
    if (rule->tokens) kc.token_counts.insert(rule->tokens(*c));
    for (const int64_t f : rule->features(*c)) kc.feature_counts.insert(f);
  }
  for (size_t a = 0; a < rule->axes.size(); ++a) {
    AxisCoverage ac{rule->axes[a].name, rule->axes[a].in_pairs, {}, {}};
    for (const auto& row : values) ++ac.reached[row[a]];
    for (const auto& v : rule->axes[a].values) {
      if (!ac.reached.count(v)) ac.missing.push_back(v);
    }
    kc.axes.push_back(std::move(ac));
  }
  if (rule->tokens) kc.token_residues = token_residues(kc.token_counts);
  kc.feature_residues = feature_residues(kc.feature_counts);
  for (size_t a = 0; a < rule->axes.size(); ++a) {
    for (size_t b = a + 1; b < rule->axes.size(); ++b) {
      if (!rule->axes[a].in_pairs || !rule->axes[b].in_pairs) continue;
      std::set<std::pair<std::string, std::string>> seen;
      for (const auto& row : values) seen.emplace(row[a], row[b]);
      for (const auto& va : rule->axes[a].values) {
        for (const auto& vb : rule->axes[b].values) {
          ++kc.pairs_required;
          if (!seen.count({va, vb})) {
            kc.missing_pairs.push_back({rule->axes[a].name, va, rule->axes[b].name, vb});
          }
        }
      }
    }
  }
  return kc;
}

std::string join_counts(const std::set<int64_t>& s, size_t at_most) {
  std::ostringstream out;
  size_t i = 0;
  for (const int64_t v : s) {
    if (i == at_most) {
      out << " ... (" << s.size() << " in all)";
      break;
    }
    out << (i++ ? " " : "") << v;
  }
  return out.str();
}

void print_residues(std::ostream& out, const char* label,
                    const std::vector<ResidueCoverage>& residues) {
  out << "  " << std::left << std::setw(16) << label;
  for (const auto& rc : residues) {
    out << " mod " << rc.modulus << ": ";
    if (rc.missing.empty()) {
      out << rc.reached.size() << " residues";
    } else {
      std::string m;
      for (const auto& s : rc.missing) m += (m.empty() ? "" : ",") + s;
      out << "MISSING " << m;
    }
    out << ";";
  }
  out << "\n";
}

}  // namespace

std::vector<std::string> KindCoverage::missing() const {
  std::vector<std::string> out;
  for (const auto& a : axes) {
    for (const auto& v : a.missing) out.push_back(kind + ": no case with " + a.name + " = " + v);
  }
  const auto residues = [&](const char* what, const std::vector<ResidueCoverage>& rs) {
    for (const auto& rc : rs) {
      for (const auto& cls : rc.missing) {
        out.push_back(kind + ": no " + what + " count with residue " + cls + " modulo " +
                      std::to_string(rc.modulus));
      }
    }
  };
  residues("token", token_residues);
  residues("feature", feature_residues);
  for (const auto& p : missing_pairs) {
    out.push_back(kind + ": no case with " + p.axis_a + " = " + p.value_a + " and " + p.axis_b +
                  " = " + p.value_b);
  }
  return out;
}

int64_t CoverageReport::missing() const {
  int64_t n = 0;
  for (const auto& k : kinds) n += static_cast<int64_t>(k.missing().size());
  return n;
}

CoverageReport measure_coverage(const std::vector<CaseSpec>& cases) {
  std::map<std::string, std::vector<const CaseSpec*>> by_kind;
  for (const auto& c : cases) by_kind[c.kind].push_back(&c);
  CoverageReport report;
  report.cases = static_cast<int64_t>(cases.size());
  for (const auto& [kind, list] : by_kind) report.kinds.push_back(measure_kind(kind, list));
  return report;
}

void print_coverage(std::ostream& out, const CoverageReport& report) {
  for (const auto& k : report.kinds) {
    out << k.kind << ": " << k.cases << " cases";
    if (!k.has_requirements) {
      out << " (no coverage requirements for this kind)\n";
      continue;
    }
    out << "\n";
    for (const auto& a : k.axes) {
      out << "  " << std::left << std::setw(16) << a.name;
      for (const auto& [v, n] : a.reached) out << " " << v << " (" << n << ")";
      for (const auto& v : a.missing) out << " MISSING " << v;
      out << "\n";
    }
    if (!k.token_counts.empty()) {
      out << "  " << std::left << std::setw(16) << "token counts"
          << " " << join_counts(k.token_counts, 24) << "\n";
      print_residues(out, "token residues", k.token_residues);
    }
    out << "  " << std::left << std::setw(16) << "feature counts"
        << " " << join_counts(k.feature_counts, 24) << "\n";
    print_residues(out, "feature residues", k.feature_residues);
    out << "  " << std::left << std::setw(16) << "pairs"
        << " " << k.pairs_required - static_cast<int64_t>(k.missing_pairs.size()) << " of "
        << k.pairs_required << " reached\n";
  }
  const int64_t missing = report.missing();
  for (const auto& k : report.kinds) {
    for (const auto& line : k.missing()) out << "missing: " << line << "\n";
  }
  out << report.cases << " cases; " << (missing == 0 ? "nothing" : std::to_string(missing))
      << " missing\n";
}

nlohmann::ordered_json coverage_json(const CoverageReport& report) {
  nlohmann::ordered_json kinds = nlohmann::ordered_json::array();
  const auto residues_json = [](const std::vector<ResidueCoverage>& rs) {
    nlohmann::ordered_json j = nlohmann::ordered_json::array();
    for (const auto& rc : rs) {
      j.push_back({{"modulus", rc.modulus}, {"reached", rc.reached}, {"missing", rc.missing}});
    }
    return j;
  };
  for (const auto& k : report.kinds) {
    nlohmann::ordered_json axes = nlohmann::ordered_json::array();
    for (const auto& a : k.axes) {
      axes.push_back({{"name", a.name},
                      {"in_pairs", a.in_pairs},
                      {"reached", a.reached},
                      {"missing", a.missing}});
    }
    nlohmann::ordered_json pairs = nlohmann::ordered_json::array();
    for (const auto& p : k.missing_pairs) {
      pairs.push_back({{p.axis_a, p.value_a}, {p.axis_b, p.value_b}});
    }
    kinds.push_back({{"kind", k.kind},
                     {"cases", k.cases},
                     {"has_requirements", k.has_requirements},
                     {"axes", axes},
                     {"token_counts", k.token_counts},
                     {"token_residues", residues_json(k.token_residues)},
                     {"feature_counts", k.feature_counts},
                     {"feature_residues", residues_json(k.feature_residues)},
                     {"pairs_required", k.pairs_required},
                     {"missing_pairs", pairs},
                     {"missing", k.missing()}});
  }
  return {{"cases", report.cases}, {"missing", report.missing()}, {"kinds", kinds}};
}

}  // namespace gradscope

// Case specs: a case's fields and their schema (type, default, choices, bounds). Loading case
// files is catalog/case_file.h, which knows every kind's fields.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "reports/report_types.h"

namespace gradscope {

// Seeds are at most 9e15, below 2^53, so that a seed read as a JSON or TOML number by any tool
// is the same integer.
inline constexpr int64_t kMaxCaseSeed = 9000000000000000;

enum class FieldType { kInt, kFloat, kBool, kString };

struct FieldSpec {
  FieldSpec(std::string name, FieldType type, report::SpecValue default_value, std::string doc)
      : name(std::move(name)),
        type(type),
        default_value(std::move(default_value)),
        doc(std::move(doc)) {}
  FieldSpec one_of(std::vector<report::SpecValue> allowed) && {
    choices = std::move(allowed);
    return std::move(*this);
  }
  FieldSpec in_range(double lo, double hi) && {
    min = lo;
    max = hi;
    return std::move(*this);
  }

  std::string name;
  FieldType type;
  report::SpecValue default_value;
  std::string doc;
  std::vector<report::SpecValue> choices;  // allowed values; empty means any
  std::optional<double> min;               // numeric bounds, inclusive
  std::optional<double> max;
};

// Tensors a program hosting the engine hands a case in memory, in place of the seeded draws
// of the same names (harness/kinds/case_tensors.h), as a `tensors` file does.
struct GivenTensors;

// One case: a kind and a value for every field of its schema.
class CaseSpec {
 public:
  std::string kind;
  std::string file;  // the case file (or where a host program built it)
  // Set by a host program (the Python package): the case's tensors as values, not a file.
  std::shared_ptr<const GivenTensors> given_tensors;

  const report::SpecFields& fields() const { return fields_; }
  int64_t get_int(const std::string& name) const;
  double get_float(const std::string& name) const;
  bool get_bool(const std::string& name) const;
  const std::string& get_string(const std::string& name) const;
  // Where the value came from: "file:line", "default" or "--flag".
  const std::string& origin(const std::string& name) const;

  void set(const std::string& name, report::SpecValue value, std::string origin);
  // The resolved case as case-file text (every field, kind first).
  std::string to_toml() const;

 private:
  const report::SpecValue& get(const std::string& name) const;
  report::SpecFields fields_;
  std::map<std::string, std::string> origins_;
};

// Fields every kind has: kind, seed, dtype, device.
const std::vector<FieldSpec>& common_fields();

// Checks a value against its field's type, choices and bounds.
void validate_field(const FieldSpec& field, const report::SpecValue& value,
                    const std::string& where);

std::string field_type_name(FieldType type);

}  // namespace gradscope

namespace gradscope {
// An InputError for one field of a case: "<where the value came from>: <field> <problem>".
[[noreturn]] void throw_field_error(const CaseSpec& spec, const std::string& field,
                                    const std::string& problem);
}  // namespace gradscope

#include "harness/spec/case_spec.h"

#include <cmath>
#include <sstream>

#include "harness/common/input_error.h"
#include "harness/spec/toml_library.h"

namespace gradscope {

using report::SpecValue;

std::string field_type_name(FieldType type) {
  switch (type) {
    case FieldType::kInt:
      return "an integer";
    case FieldType::kFloat:
      return "a number";
    case FieldType::kBool:
      return "a boolean";
    case FieldType::kString:
      return "a string";
  }
  return "?";
}

// A bound as the field's type reads: [1, 4096] for an integer field, not [1.000000, ...].
std::string bound_text(const FieldSpec& field, double bound) {
  if (field.type == FieldType::kInt) return std::to_string(static_cast<int64_t>(bound));
  return report::format_spec_value(bound);
}

void validate_field(const FieldSpec& field, const SpecValue& value, const std::string& at) {
  if (!field.choices.empty()) {
    bool found = false;
    std::string allowed;
    for (const auto& c : field.choices) {
      found = found || c == value;
      allowed += (allowed.empty() ? "" : ", ") + report::format_spec_value(c);
    }
    if (!found) {
      throw InputError(at + ": key '" + field.name + "' is " + report::format_spec_value(value) +
                       "; expected one of " + allowed);
    }
  }
  double number = 0;
  if (const auto* i = std::get_if<int64_t>(&value)) number = static_cast<double>(*i);
  if (const auto* d = std::get_if<double>(&value)) number = *d;
  if (std::holds_alternative<double>(value) && !std::isfinite(number)) {
    throw InputError(at + ": key '" + field.name + "' must be finite");
  }
  if ((field.min && number < *field.min) || (field.max && number > *field.max)) {
    std::ostringstream msg;
    msg << at << ": key '" << field.name << "' is " << report::format_spec_value(value)
        << "; expected " << (field.type == FieldType::kInt ? "an integer" : "a value") << " in ["
        << (field.min ? bound_text(field, *field.min) : "-inf") << ", "
        << (field.max ? bound_text(field, *field.max) : "inf") << "]";
    throw InputError(msg.str());
  }
}

const std::vector<FieldSpec>& common_fields() {
  static const std::vector<FieldSpec> fields = {
      FieldSpec("kind", FieldType::kString, std::string(), "case kind (required)"),
      FieldSpec("seed", FieldType::kInt, int64_t{1}, "case seed; every tensor has its own stream")
          .in_range(0, static_cast<double>(kMaxCaseSeed)),
      FieldSpec("dtype", FieldType::kString, std::string("fp32"), "activation / output dtype")
          .one_of({std::string("fp32"), std::string("fp16"), std::string("bf16")}),
      FieldSpec("device", FieldType::kString, std::string("cpu"), "where prod runs")
          .one_of({std::string("cpu"), std::string("cuda")}),
  };
  return fields;
}

const SpecValue& CaseSpec::get(const std::string& name) const {
  for (const auto& [n, v] : fields_) {
    if (n == name) return v;
  }
  throw std::logic_error("case spec has no field '" + name + "'");
}

int64_t CaseSpec::get_int(const std::string& name) const {
  return std::get<int64_t>(get(name));
}
double CaseSpec::get_float(const std::string& name) const {
  return std::get<double>(get(name));
}
bool CaseSpec::get_bool(const std::string& name) const {
  return std::get<bool>(get(name));
}
const std::string& CaseSpec::get_string(const std::string& name) const {
  return std::get<std::string>(get(name));
}

const std::string& CaseSpec::origin(const std::string& name) const {
  static const std::string unknown = "?";
  auto it = origins_.find(name);
  return it == origins_.end() ? unknown : it->second;
}

void CaseSpec::set(const std::string& name, SpecValue value, std::string origin) {
  origins_[name] = std::move(origin);
  for (auto& [n, v] : fields_) {
    if (n == name) {
      v = std::move(value);
      return;
    }
  }
  fields_.emplace_back(name, std::move(value));
}

std::string CaseSpec::to_toml() const {
  toml::table table;
  for (const auto& [name, value] : fields_) {
    std::visit([&, n = name](const auto& v) { table.insert_or_assign(n, v); }, value);
  }
  std::ostringstream out;
  out << "kind = \"" << kind << "\"\n";
  table.erase("kind");
  out << table << "\n";
  return out.str();
}

void throw_field_error(const CaseSpec& spec, const std::string& field, const std::string& problem) {
  throw InputError(spec.origin(field) + ": " + field + " " + problem);
}

}  // namespace gradscope

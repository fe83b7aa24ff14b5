#include "harness/catalog/case_file.h"

#include <cmath>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <sstream>

#include "harness/catalog/kind_registry.h"
#include "harness/common/file_system.h"
#include "harness/common/input_error.h"
#include "harness/spec/toml_library.h"
#include "harness/spec/toml_text.h"

namespace gradscope {
namespace {

using report::SpecValue;

const char* toml_type_name(toml::node_type t) {
  switch (t) {
    case toml::node_type::integer:
      return "an integer";
    case toml::node_type::floating_point:
      return "a float";
    case toml::node_type::boolean:
      return "a boolean";
    case toml::node_type::string:
      return "a string";
    case toml::node_type::array:
      return "an array";
    case toml::node_type::table:
      return "a table";
    default:
      return "a date/time";
  }
}

std::string where(const std::string& file, const toml::source_region& src) {
  return file + ":" + std::to_string(src.begin.line);
}

const FieldSpec* find_field(const std::vector<FieldSpec>& schema, const std::string& name) {
  for (const auto& f : schema) {
    if (f.name == name) return &f;
  }
  return nullptr;
}

std::string known_keys(const std::vector<FieldSpec>& schema) {
  std::string out;
  for (const auto& f : schema) out += (out.empty() ? "" : ", ") + f.name;
  return out + ", matrix, cases, description";
}

SpecValue from_toml(const FieldSpec& field, const toml::node& node, const std::string& at) {
  const bool ok =
      (field.type == FieldType::kInt && node.is_integer()) ||
      (field.type == FieldType::kFloat && (node.is_floating_point() || node.is_integer())) ||
      (field.type == FieldType::kBool && node.is_boolean()) ||
      (field.type == FieldType::kString && node.is_string());
  if (!ok) {
    throw InputError(at + ": key '" + field.name + "' must be " + field_type_name(field.type) +
                     ", got " + toml_type_name(node.type()));
  }
  SpecValue value;
  switch (field.type) {
    case FieldType::kInt:
      value = node.as_integer()->get();
      break;
    case FieldType::kFloat:
      value = node.is_integer() ? static_cast<double>(node.as_integer()->get())
                                : node.as_floating_point()->get();
      break;
    case FieldType::kBool:
      value = node.as_boolean()->get();
      break;
    case FieldType::kString:
      value = node.as_string()->get();
      break;
  }
  validate_field(field, value, at);
  return value;
}

SpecValue parse_text(const FieldSpec& field, const std::string& text, const std::string& at) {
  try {
    size_t used = 0;
    switch (field.type) {
      case FieldType::kInt: {
        const long long v = std::stoll(text, &used);
        if (used == text.size()) return static_cast<int64_t>(v);
        break;
      }
      case FieldType::kFloat: {
        const double v = std::stod(text, &used);
        if (used == text.size()) return v;
        break;
      }
      case FieldType::kBool:
        if (text == "true") return true;
        if (text == "false") return false;
        break;
      case FieldType::kString:
        return text;
    }
  } catch (const std::exception&) {
  }
  throw InputError(at + ": '" + text + "' is not " + field_type_name(field.type));
}

void validate_case(const CaseSpec& spec) {
  find_kind(spec.kind)->validate(spec);
}

}  // namespace

std::vector<FieldSpec> schema_for_kind(const std::string& kind) {
  std::vector<FieldSpec> schema = common_fields();
  if (const CaseKind* k = find_kind(kind)) {
    for (const auto& f : k->fields()) schema.push_back(f);
  }
  return schema;
}

namespace {

// A [matrix] multiplies: a few long axes would otherwise exhaust memory.
constexpr size_t kMaxCasesPerFile = 100000;

std::string kind_list() {
  std::string k;
  for (const auto& n : kind_names()) k += (k.empty() ? "" : ", ") + n;
  return k;
}

// The file's `kind`, which must name a registered kind.
const toml::node& kind_node_of(const toml::table& table, const std::string& path) {
  const toml::node* node = table.get("kind");
  if (node && !node->is_string()) {
    throw InputError(where(path, node->source()) + ": key 'kind' must be a string, got " +
                     toml_type_name(node->type()));
  }
  if (!node) throw InputError(path + ": missing key 'kind' (a string: one of " + kind_list() + ")");
  const std::string kind = node->as_string()->get();
  if (!find_kind(kind)) {
    throw InputError(where(path, node->source()) + ": unknown kind '" + kind +
                     "'; expected one of " + kind_list());
  }
  return *node;
}

// A case file's table read against its kind's schema: the top-level fields (into `base`), the
// [[cases]] entries and the [matrix] axes, each value checked against its field where it is.
class CaseTable {
 public:
  CaseTable(const toml::table& table, const std::string& path, const FieldOrigins& origins)
      : table_(table), path_(path) {
    const toml::node& kind_node = kind_node_of(table, path);
    kind_ = kind_node.as_string()->get();
    schema_ = schema_for_kind(kind_);
    base_.kind = kind_;
    base_.file = path;
    for (const auto& f : schema_) base_.set(f.name, f.default_value, "default");
    base_.set("kind", kind_, where(path, kind_node.source()));
    for (auto&& [key, node] : table) {
      const std::string name(key.str());
      const auto known = origins.find(name);
      const std::string at = known != origins.end() ? known->second : where(path, key.source());
      if (name == "kind") continue;
      if (name == "description") {
        if (!node.is_string()) throw InputError(at + ": key 'description' must be a string");
      } else if (name == "cases") {
        read_entries(node, at);
      } else if (name == "matrix") {
        read_matrix(node, at);
      } else {
        base_.set(name, from_toml(field(name, "", at), node, at), at);
      }
    }
  }

  // Each [[cases]] entry in file order, then the cartesian product of the matrix axes, the
  // first axis varying slowest.
  std::vector<CaseSpec> expanded() const {
    std::vector<CaseSpec> cases;
    for (const auto& entry : entries_.empty() ? std::vector<Entry>{Entry{}} : entries_) {
      CaseSpec c = base_;
      for (const auto& f : entry) c.set(f.field->name, f.value, f.at);
      cases.push_back(std::move(c));
    }
    for (const auto& [field, values] : axes_) {
      std::vector<CaseSpec> next;
      for (const auto& c : cases) {
        for (const auto& [value, at] : values) {
          CaseSpec expanded = c;
          expanded.set(field->name, value, at);
          next.push_back(std::move(expanded));
        }
      }
      cases = std::move(next);
    }
    return cases;
  }

 private:
  // One [[cases]] entry's fields: a row of a covering array, crossed with the matrix.
  struct EntryField {
    const FieldSpec* field;
    SpecValue value;
    std::string at;
  };
  using Entry = std::vector<EntryField>;

  // The schema's field `name`; `section` ("", "cases.", "matrix.") names where it was set.
  const FieldSpec& field(const std::string& name, const std::string& section,
                         const std::string& at) const {
    const FieldSpec* f = find_field(schema_, name);
    if (!f || (name == "kind" && !section.empty())) {
      throw InputError(at + ": unknown key '" + section + name + "' for kind '" + kind_ +
                       "' (known: " + known_keys(schema_) + ")");
    }
    return *f;
  }

  void count(size_t factor, const std::string& at, const std::string& what) {
    expanded_count_ *= factor;
    if (expanded_count_ > kMaxCasesPerFile) {
      throw InputError(at + ": " + what + " more than " + std::to_string(kMaxCasesPerFile) +
                       " cases; split the file");
    }
  }

  void read_entries(const toml::node& node, const std::string& at) {
    const auto* list = node.as_array();
    if (!list || list->empty() || !list->is_array_of_tables()) {
      throw InputError(at + ": key 'cases' must be a non-empty array of tables ([[cases]])");
    }
    const auto* matrix = table_.get("matrix");
    for (const auto& element : *list) {
      Entry entry;
      for (auto&& [ekey, enode] : *element.as_table()) {
        const std::string ename(ekey.str());
        const std::string eat = where(path_, ekey.source());
        const FieldSpec& f = field(ename, "cases.", eat);
        if (table_.contains(ename)) {
          throw InputError(eat + ": key '" + ename +
                           "' is set both at the top level and in [[cases]]");
        }
        if (matrix && matrix->is_table() && matrix->as_table()->contains(ename)) {
          throw InputError(eat + ": key '" + ename + "' is set both in [matrix] and in [[cases]]");
        }
        entry.push_back({&f, from_toml(f, enode, eat), eat});
      }
      entries_.push_back(std::move(entry));
    }
    count(entries_.size(), at, "[[cases]] and [matrix] expand to");
  }

  void read_matrix(const toml::node& node, const std::string& at) {
    if (!node.is_table()) throw InputError(at + ": key 'matrix' must be a table of arrays");
    for (auto&& [mkey, mnode] : *node.as_table()) {
      const std::string mname(mkey.str());
      const std::string mat = where(path_, mkey.source());
      const FieldSpec& f = field(mname, "matrix.", mat);
      if (table_.contains(mname)) {
        throw InputError(mat + ": key '" + mname +
                         "' is set both at the top level and in [matrix]");
      }
      if (!mnode.is_array() || mnode.as_array()->empty()) {
        throw InputError(mat + ": key 'matrix." + mname + "' must be a non-empty array");
      }
      count(mnode.as_array()->size(), mat, "[matrix] expands to");
      std::vector<std::pair<SpecValue, std::string>> values;
      for (const auto& element : *mnode.as_array()) {
        values.emplace_back(from_toml(f, element, mat), mat);
      }
      axes_.emplace_back(&f, std::move(values));
    }
  }

  const toml::table& table_;
  const std::string& path_;
  std::string kind_;
  std::vector<FieldSpec> schema_;
  CaseSpec base_;
  std::vector<Entry> entries_;
  std::vector<std::pair<const FieldSpec*, std::vector<std::pair<SpecValue, std::string>>>> axes_;
  size_t expanded_count_ = 1;
};

std::vector<CaseSpec> cases_from_table(const toml::table& table, const std::string& path,
                                       const FieldOrigins& origins) {
  auto cases = CaseTable(table, path, origins).expanded();
  for (const auto& c : cases) validate_case(c);
  return cases;
}

}  // namespace

std::vector<CaseSpec> load_case_file(const std::string& path) {
  if (!files::is_regular_file(path)) {
    throw InputError(path + (files::is_directory(path)
                                 ? ": is a folder; give case files, or the folder as --suite "
                                   "with --cases-dir"
                             : files::exists(path) ? ": not a regular file"
                                                   : ": case file not found"));
  }
  return cases_from_table(read_toml_file(path, "case file"), path, {});
}

std::vector<CaseSpec> parse_case_text(std::string_view text, const std::string& path,
                                      const FieldOrigins& origins) {
  return cases_from_table(parse_toml_text(text, path), path, origins);
}

namespace {

const char* value_type_name(const SpecValue& v) {
  return std::holds_alternative<int64_t>(v)  ? "an integer"
         : std::holds_alternative<double>(v) ? "a float"
         : std::holds_alternative<bool>(v)   ? "a boolean"
                                             : "a string";
}

// A value of the field's own type, as from_toml takes it: an integer serves a float field.
SpecValue checked_value(const FieldSpec& field, const SpecValue& v, const std::string& at) {
  SpecValue value = v;
  if (field.type == FieldType::kFloat && std::holds_alternative<int64_t>(v)) {
    value = static_cast<double>(std::get<int64_t>(v));
  }
  const bool ok = (field.type == FieldType::kInt && std::holds_alternative<int64_t>(value)) ||
                  (field.type == FieldType::kFloat && std::holds_alternative<double>(value)) ||
                  (field.type == FieldType::kBool && std::holds_alternative<bool>(value)) ||
                  (field.type == FieldType::kString && std::holds_alternative<std::string>(value));
  if (!ok) {
    throw InputError(at + ": key '" + field.name + "' must be " + field_type_name(field.type) +
                     ", got " + value_type_name(v));
  }
  if (const auto* text = std::get_if<std::string>(&value);
      text && text->find('\0') != std::string::npos) {
    throw InputError(at + ": key '" + field.name + "' holds a NUL character");
  }
  validate_field(field, value, at);
  return value;
}

}  // namespace

std::vector<CaseSpec> cases_from_values(const std::string& kind, const FieldValues& fields,
                                        const MatrixValues& matrix, const std::string& origin) {
  if (!find_kind(kind)) {
    std::string k;
    for (const auto& n : kind_names()) k += (k.empty() ? "" : ", ") + n;
    throw InputError(origin + ": unknown kind '" + kind + "'; expected one of " + k);
  }
  const auto schema = schema_for_kind(kind);
  const auto field_of = [&](const std::string& name) {
    const FieldSpec* field = find_field(schema, name);
    if (!field || name == "kind") {
      throw InputError(origin + ": unknown key '" + name + "' for kind '" + kind +
                       "' (known: " + known_keys(schema) + ")");
    }
    return field;
  };
  CaseSpec base;
  base.kind = kind;
  base.file = origin;
  for (const auto& f : schema) base.set(f.name, f.default_value, "default");
  base.set("kind", kind, origin);
  for (const auto& [name, value] : fields) {
    base.set(name, checked_value(*field_of(name), value, origin), origin);
  }
  std::vector<CaseSpec> cases{base};
  for (const auto& [name, values] : matrix) {
    const FieldSpec* field = field_of(name);
    if (values.empty()) throw InputError(origin + ": matrix key '" + name + "' has no values");
    std::vector<CaseSpec> next;
    for (const auto& c : cases) {
      for (const auto& value : values) {
        CaseSpec expanded = c;
        expanded.set(name, checked_value(*field, value, origin), origin);
        next.push_back(std::move(expanded));
      }
    }
    if (next.size() > kMaxCasesPerFile) {
      throw InputError(origin + ": the matrix expands to more than " +
                       std::to_string(kMaxCasesPerFile) + " cases");
    }
    cases = std::move(next);
  }
  for (const auto& c : cases) validate_case(c);
  return cases;
}

void override_field(CaseSpec& spec, const std::string& name, const std::string& text,
                    const std::string& flag) {
  const auto schema = schema_for_kind(spec.kind);
  const FieldSpec* field = find_field(schema, name);
  if (!field) throw std::logic_error("override of unknown field " + name);
  const SpecValue value = parse_text(*field, text, flag);
  validate_field(*field, value, flag);
  spec.set(name, value, flag);
  validate_case(spec);
}

}  // namespace gradscope

// Case files: TOML with [matrix] expansion, validated against the schema of the kind they
// name (docs/case-files.md), and CLI overrides. Unknown keys, wrong types and out-of-range
// values are InputErrors naming the file, line and key.
#pragma once

#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "harness/spec/case_spec.h"

namespace gradscope {

// Common fields followed by the kind's own.
std::vector<FieldSpec> schema_for_kind(const std::string& kind);
// Loads one case file; a [matrix] table of arrays expands into the cartesian
// product. Each case is validated (field ranges and the runner's shape rules).
std::vector<CaseSpec> load_case_file(const std::string& path);
// The same for case-file text; `path` names it in errors and in CaseSpec::file. A case built
// as text (from a checkpoint) names where each field's value came from in `origins` (field ->
// "C/config.json (hidden_size)"), since a line of the generated text means nothing to a user.
using FieldOrigins = std::map<std::string, std::string>;
std::vector<CaseSpec> parse_case_text(std::string_view text, const std::string& path,
                                      const FieldOrigins& origins = {});
// Cases built from values, not text: a host program's arguments (the Python package). Each
// value is checked against its field as a case file's is (type, choices, range; an integer
// serves a float field, nothing else is converted), and errors name `origin` and the field.
// `matrix` expands as a case file's [matrix] does, the first axis varying slowest.
using FieldValues = std::vector<std::pair<std::string, report::SpecValue>>;
using MatrixValues = std::vector<std::pair<std::string, std::vector<report::SpecValue>>>;
std::vector<CaseSpec> cases_from_values(const std::string& kind, const FieldValues& fields,
                                        const MatrixValues& matrix, const std::string& origin);
// Applies a CLI override (--dtype/--device/--seed) and re-validates the case.
void override_field(CaseSpec& spec, const std::string& name, const std::string& text,
                    const std::string& flag);

}  // namespace gradscope

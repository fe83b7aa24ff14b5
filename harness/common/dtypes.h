// The dtype table (common/dtype_table.h) as ATen sees it.
#pragma once

#include <c10/core/ScalarType.h>

#include <stdexcept>
#include <string>

#include "common/dtype_table.h"

namespace gradscope {

// The ATen type of a table row.
at::ScalarType scalar_type_of(const DtypeFacts& dtype);

// A table row by name; throws std::invalid_argument naming the known ones.
const DtypeFacts& dtype_facts(const std::string& name);
// A tensor dtype's row; types outside the table (bool, int8, ...) have none: nullptr.
const DtypeFacts* dtype_facts(at::ScalarType type);
// The facts of a floating dtype; other types read as fp32 (a comparison of an integer
// tensor is exact and takes no tolerance from it).
const DtypeFacts& floating_facts(at::ScalarType type);

// A case file's activation dtype (fp32, fp16, bf16).
at::ScalarType dtype_from_name(const std::string& name);

}  // namespace gradscope

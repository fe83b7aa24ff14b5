#include "harness/common/dtypes.h"

namespace gradscope {

at::ScalarType scalar_type_of(const DtypeFacts& d) {
  if (d.name == "fp16") return at::kHalf;
  if (d.name == "bf16") return at::kBFloat16;
  if (d.name == "fp64") return at::kDouble;
  if (d.name == "int32") return at::kInt;
  if (d.name == "int64") return at::kLong;
  return at::kFloat;
}

const DtypeFacts& dtype_facts(const std::string& name) {
  if (const auto* d = find_dtype(name)) return *d;
  std::string known;
  for (const auto& d : kDtypeTable) known += (known.empty() ? "" : ", ") + std::string(d.name);
  throw std::invalid_argument("unknown dtype '" + name + "'; expected one of " + known);
}

const DtypeFacts* dtype_facts(at::ScalarType type) {
  for (const auto& d : kDtypeTable) {
    if (scalar_type_of(d) == type) return &d;
  }
  return nullptr;
}

const DtypeFacts& floating_facts(at::ScalarType type) {
  const auto* d = dtype_facts(type);
  return d && d->floating ? *d : *find_dtype("fp32");
}

at::ScalarType dtype_from_name(const std::string& name) {
  const auto* d = find_dtype(name);
  if (!d || (name != "fp32" && name != "fp16" && name != "bf16")) {
    throw std::invalid_argument("dtype must be fp32, fp16 or bf16, got '" + name + "'");
  }
  return scalar_type_of(*d);
}

}  // namespace gradscope

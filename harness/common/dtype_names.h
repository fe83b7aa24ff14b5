// Case-file dtype names (fp32, fp16, bf16) and their ATen types.
#pragma once

#include <c10/core/ScalarType.h>

#include <stdexcept>
#include <string>

namespace gradscope {

inline at::ScalarType dtype_from_name(const std::string& name) {
  if (name == "fp32") return at::kFloat;
  if (name == "fp16") return at::kHalf;
  if (name == "bf16") return at::kBFloat16;
  throw std::invalid_argument("dtype must be fp32, fp16 or bf16, got '" + name + "'");
}

}  // namespace gradscope

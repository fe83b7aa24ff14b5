// Every dtype fact gradscope uses, in one table: the names case files and reports use, the
// floating formats' rounding (for the floor, docs/verification.md), their epsilons and
// torch.testing.assert_close's default tolerances. Torch-free: reports/, harness/ and
// bench/ read it; harness/common/dtypes.h maps it to ATen types.
#pragma once

#include <string_view>

namespace gradscope {

struct DtypeFacts {
  std::string_view name;  // fp32, fp16, bf16, fp64, int32, int64
  bool floating;
  // Floating formats (0 for integers):
  double unit_roundoff;       // 2^-p: the relative error bound of one rounding
  double subnormal_roundoff;  // half the smallest subnormal: the absolute bound below the normals
  double epsilon;             // 2^(1-p): the distance from 1 to the next value
  double max;                 // the largest finite value
  double rtol, atol;          // torch.testing.assert_close's defaults
};

// fp64's subnormal_roundoff is 0: the reference computes in fp64 and its own rounding is not
// part of the model.
inline constexpr DtypeFacts kDtypeTable[] = {
    {"fp32", true, 0x1.0p-24, 0x1.0p-150, 0x1.0p-23, 0x1.FFFFFEp127, 1.3e-6, 1e-5},
    {"fp16", true, 0x1.0p-11, 0x1.0p-25, 0x1.0p-10, 65504.0, 1e-3, 1e-5},
    {"bf16", true, 0x1.0p-8, 0x1.0p-134, 0x1.0p-7, 0x1.FEp127, 1.6e-2, 1e-5},
    {"fp64", true, 0x1.0p-53, 0.0, 0x1.0p-52, 0x1.FFFFFFFFFFFFFp1023, 1e-7, 1e-7},
    {"int32", false, 0, 0, 0, 2147483647.0, 0, 0},
    {"int64", false, 0, 0, 0, 9223372036854775807.0, 0, 0},
};

// nullptr for a name not in the table.
inline const DtypeFacts* find_dtype(std::string_view name) {
  for (const auto& d : kDtypeTable) {
    if (d.name == name) return &d;
  }
  return nullptr;
}

}  // namespace gradscope

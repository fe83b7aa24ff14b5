// Comparison of prod against the fp64 reference, producing report::Check records
// with assert_close-style failure messages.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <string>
#include <vector>

#include "reports/report_types.h"

namespace gradscope {

// Describes one element for a failure message, e.g. "code 7, zero 8, group 3".
using ElementDescriber = std::function<std::string(const std::vector<int64_t>& index)>;

// Exact mode: `ref` (fp64 or int64) is rounded once to prod's dtype and every
// element must match bit for bit. A reference that is all zero fails (a
// degenerate comparison proves nothing).
report::Check compare_exact(const std::string& path, const std::string& compared,
                            const at::Tensor& prod, const at::Tensor& ref,
                            const ElementDescriber& describe = {}, bool keep_tensors = false);

// The ratio rule (shared/docs/verification.md): with err(x) = max |x - ref|,
// pass iff err(prod) <= ratio * err(base) + floor, floor = 2 * ulp(max |ref|) in the
// compute dtype: room for a correct result rounded differently from an exact baseline. Fails a
// reference or a prod that is all zero. Reports mean error, relative Frobenius error, cosine, the
// worst element and the mismatch count under torch.testing's default tolerances.
// With ErrorStatistic::kMeanAbs, err(x) = mean |x - ref| instead: for tensors whose
// per-element errors are heavy-tailed, where the max is a handful of samples.
enum class ErrorStatistic { kMaxAbs, kMeanAbs };
report::Check compare_ratio(const std::string& path, const at::Tensor& prod, const at::Tensor& base,
                            const at::Tensor& ref, at::ScalarType compute_dtype,
                            bool keep_tensors = false, double ratio = 2.0,
                            ErrorStatistic statistic = ErrorStatistic::kMaxAbs);

// Machine epsilon of fp32 / fp16 / bf16 (fp64 too).
double dtype_epsilon(at::ScalarType dtype);
// Unit in the last place of `magnitude` in `dtype` (normal range).
double ulp(double magnitude, at::ScalarType dtype);

// A check that an operation refused its input (and did not silently proceed).
report::Check expect_rejection(const std::string& path, const std::string& compared, bool rejected,
                               const std::string& detail);

// Unravels a flat index of a contiguous tensor with the given shape.
std::vector<int64_t> unravel_index(int64_t flat, at::IntArrayRef shape);

}  // namespace gradscope

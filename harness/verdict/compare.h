// Comparison of prod against the fp64 reference, producing report::Check records
// with assert_close-style failure messages.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "reports/report_types.h"

namespace gradscope {

// Describes one element for a failure message, e.g. "code 7, zero 8, group 3".
using ElementDescriber = std::function<std::string(const std::vector<int64_t>& index)>;

// What prod must hand back for one compared tensor, as torch.testing.assert_close checks
// it before any value: a wrong dtype, device or shape is a failing check of its own.
struct Expected {
  at::ScalarType dtype = at::kFloat;
  at::Device device = at::kCPU;
};

// Exact mode: `ref` (fp64 or int64) is rounded once to the expected dtype and every
// element must match bit for bit. A reference that is all zero fails (a degenerate
// comparison proves nothing). Without `expected` (integer words and codes the harness
// unpacked itself) the reference is rounded to prod's own dtype. `zero_allowed` lifts the
// degenerate-comparison rule for stored words that may legitimately be all zero (g_idx of a
// layer with one group).
report::Check compare_exact(const std::string& path, const std::string& compared,
                            const at::Tensor& prod, const at::Tensor& ref,
                            const ElementDescriber& describe = {}, bool keep_tensors = false,
                            const std::optional<Expected>& expected = std::nullopt,
                            bool zero_allowed = false);

// The one bit view of the project: a same-width integer view of a float tensor (contiguous;
// other dtypes as they are), so that +0 and -0 differ and NaN payloads count.
at::Tensor bit_pattern(const at::Tensor& t);

// Bit-for-bit comparison of two tensors of one dtype (state, not a computed result: stored
// words, gathered shards, reloaded parameters). All-zero tensors compare like any other.
report::Check compare_bits(const std::string& path, const std::string& compared,
                           const at::Tensor& got, const at::Tensor& want);

// With ErrorStatistic::kMeanAbs, err(x) = mean |x - ref| instead of the max: for tensors whose
// per-element errors are heavy-tailed, where the max is a handful of samples.
enum class ErrorStatistic { kMaxAbs, kMeanAbs };

// The floor's standard deviations: a careful implementation's error exceeds 6 sigma at an
// element with probability below 2 exp(-18) ~ 3e-8 (docs/verification.md, "The floor").
inline constexpr double kFloorSigmas = 6.0;

// One ratio-rule comparison (docs/verification.md):
//   pass iff |prod_i - ref_i| <= ratio * err(base) + floor_i for every element i,
// with err(base) = max |base - ref| and floor_i = kFloorSigmas * sigma_i, sigma_i the
// standard deviation of a careful implementation's rounding error at element i.
struct RatioInputs {
  std::string path;
  at::Tensor prod, base;
  at::Tensor ref;    // fp64, prod's expected shape
  at::Tensor sigma;  // fp64, ref's shape
  Expected expected;
  std::string format;     // the output format's name, e.g. "fp16"
  double format_max = 0;  // its largest finite value
  // The careful implementation the floor models, for messages: "bf16 activations, fp32 adapters"
  std::string precision;
  // Set when an intermediate of the careful implementation leaves the activation format's
  // range (e.g. "mlp/h reaches 7.1e+04 > fp16 max 65504"): a prod that overflows with it
  // makes the case out of range instead of failing.
  std::string model_overflow;
  std::string model_format;  // the format that intermediate overflows, e.g. "fp16"
  // Set where the floor's model does not hold for this tensor (why, e.g. an attention whose
  // scores err past the model's first order): the figures are computed and reported, and the
  // check is out of range instead of a verdict either way.
  std::string not_judged;
  double ratio = 2.0;
  ErrorStatistic statistic = ErrorStatistic::kMaxAbs;
  bool keep_tensors = false;
};
// Also reported: mean error, relative Frobenius error, cosine, the worst element (the one
// nearest its limit) and the mismatch count under torch.testing's default tolerances.
report::Check compare_ratio(const RatioInputs& in);

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

#include "harness/verdict/compare.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include "harness/common/dtypes.h"
#include "harness/common/tensor_bridge.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <optional>
#include <sstream>
#include <tuple>

namespace gradscope {
namespace {

std::string format_index(const std::vector<int64_t>& index) {
  std::string s = "(";
  for (size_t i = 0; i < index.size(); ++i) s += (i ? ", " : "") + std::to_string(index[i]);
  return s + ")";
}

// A value with nine significant digits: enough to tell any two fp32 values apart.
std::string format_exact(double v) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}

// torch.testing.assert_close's attribute checks: prod's dtype and device, before any value.
std::optional<std::string> attribute_mismatch(const std::string& path, const at::Tensor& prod,
                                              const Expected& expected) {
  if (!prod.defined()) return path + ": prod returned no tensor";
  if (prod.scalar_type() != expected.dtype) {
    return path + ": the values for attribute 'dtype' do not match: prod is " +
           bridge::dtype_name(prod.scalar_type()) + ", expected " +
           bridge::dtype_name(expected.dtype);
  }
  if (prod.device().type() != expected.device.type()) {
    return path + ": the values for attribute 'device' do not match: prod is on " +
           prod.device().str() + ", expected " + expected.device.str();
  }
  return std::nullopt;
}

}  // namespace

at::Tensor bit_pattern(const at::Tensor& t) {
  const auto c = t.contiguous();
  switch (c.scalar_type()) {
    case at::kHalf:
    case at::kBFloat16:
      return c.view(at::kShort);
    case at::kFloat:
      return c.view(at::kInt);
    case at::kDouble:
      return c.view(at::kLong);
    default:
      return c;
  }
}

report::Check compare_bits(const std::string& path, const std::string& compared,
                           const at::Tensor& got, const at::Tensor& want) {
  if (got.scalar_type() != want.scalar_type()) {
    report::Check check;
    check.path = path;
    check.exact = true;
    check.compared = compared;
    check.numel = got.numel();
    check.mismatches = got.numel();
    check.failure = path + ": dtype " + bridge::dtype_name(got.scalar_type()) + ", expected " +
                    bridge::dtype_name(want.scalar_type());
    return check;
  }
  // Stored words may be all zero (g_idx of a layer with one group): that is still a check.
  return compare_exact(path, compared, bit_pattern(got.cpu()),
                       bit_pattern(want.cpu()).to(at::kLong), {}, false, std::nullopt,
                       /*zero_allowed=*/true);
}

std::vector<int64_t> unravel_index(int64_t flat, at::IntArrayRef shape) {
  std::vector<int64_t> index(shape.size());
  for (int64_t d = static_cast<int64_t>(shape.size()) - 1; d >= 0; --d) {
    index[d] = shape[d] == 0 ? 0 : flat % shape[d];
    flat = shape[d] == 0 ? 0 : flat / shape[d];
  }
  return index;
}

report::Check compare_exact(const std::string& path, const std::string& compared,
                            const at::Tensor& prod_in, const at::Tensor& ref_in,
                            const ElementDescriber& describe, bool keep_tensors,
                            const std::optional<Expected>& expected_in, bool zero_allowed) {
  report::Check check;
  check.path = path;
  check.exact = true;
  check.compared = compared;
  check.limit = 0;
  const Expected expected = expected_in.value_or(Expected{prod_in.scalar_type(), prod_in.device()});
  if (auto wrong = attribute_mismatch(path, prod_in, expected)) {
    check.numel = prod_in.numel();
    check.mismatches = check.numel;
    check.failure = *wrong;
    return check;
  }
  const auto prod = prod_in.detach().cpu().contiguous();
  const auto ref = ref_in.detach().cpu().contiguous();
  check.numel = prod.numel();
  if (prod.sizes() != ref.sizes()) {
    std::ostringstream msg;
    msg << path << ": shape mismatch (" << compared << "): prod " << prod.sizes() << ", ref "
        << ref.sizes();
    check.failure = msg.str();
    check.mismatches = check.numel;
    return check;
  }
  if (keep_tensors) {
    check.tensors = report::CheckTensors{bridge::to_tensor_data(prod), std::nullopt,
                                         bridge::to_tensor_data(ref), std::nullopt};
  }
  const auto ref_rounded = ref.to(expected.dtype).contiguous();
  // Equal bits (the usual outcome) are found in one pass without an elementwise temporary; the
  // mask of differing elements is built only when something differs.
  const bool identical = at::equal(bit_pattern(prod), bit_pattern(ref_rounded));
  const auto differs = identical ? at::Tensor() : bit_pattern(prod).ne(bit_pattern(ref_rounded));
  check.mismatches = identical ? 0 : differs.sum().item<int64_t>();
  const bool degenerate =
      check.numel == 0 || (!zero_allowed && ref.count_nonzero().item<int64_t>() == 0);
  check.passed = check.mismatches == 0 && !degenerate;
  // Bit-identical tensors differ by exactly 0: fp64 statistics only when something differs
  // (they are full-size temporaries, the bulk of the cost on 70B-sized weights).
  if (check.mismatches > 0) {
    const auto diff = (prod.to(at::kDouble) - ref_rounded.to(at::kDouble)).abs();
    check.max_abs = diff.max().item<double>();
    check.mean_abs = diff.mean().item<double>();
  }
  if (check.passed) return check;

  std::ostringstream msg;
  if (degenerate) {
    msg << path << ": degenerate comparison (" << compared
        << "): the reference is empty or all zero, so equality proves nothing";
    check.failure = msg.str();
    return check;
  }
  // Worst element: the largest difference among mismatching elements.
  const auto score = (prod.to(at::kDouble) - ref_rounded.to(at::kDouble))
                         .abs()
                         .masked_fill(differs.logical_not(), -1.0);
  const int64_t flat = score.argmax().item<int64_t>();
  report::WorstElement worst;
  worst.index = unravel_index(flat, prod.sizes());
  worst.prod = prod.to(at::kDouble).view(-1)[flat].item<double>();
  worst.ref = ref_rounded.to(at::kDouble).view(-1)[flat].item<double>();
  const double fp64 = ref.to(at::kDouble).view(-1)[flat].item<double>();
  if (fp64 != worst.ref) worst.ref_fp64 = fp64;
  if (describe) worst.detail = describe(worst.index);
  char pct[32];
  std::snprintf(pct, sizeof pct, "%.3g%%", 100.0 * check.mismatches / check.numel);
  msg << path << ": not bit-exact (" << compared << ")\n"
      << "        Mismatched elements: " << check.mismatches << " / " << check.numel << " (" << pct
      << ")\n"
      << "        Greatest absolute difference: " << format_exact(check.max_abs) << " at index "
      << format_index(worst.index) << " (up to 0 allowed)\n"
      << "        at " << format_index(worst.index) << ": prod " << format_exact(worst.prod)
      << ", ref " << format_exact(worst.ref);
  if (worst.ref_fp64) msg << " (fp64 " << format_exact(*worst.ref_fp64) << ")";
  if (!worst.detail.empty()) msg << "; " << worst.detail;
  check.worst = worst;
  check.failure = msg.str();
  return check;
}

double dtype_epsilon(at::ScalarType dtype) {
  return floating_facts(dtype).epsilon;
}

double ulp(double magnitude, at::ScalarType dtype) {
  if (magnitude == 0 || !std::isfinite(magnitude)) return 0;
  return dtype_epsilon(dtype) * std::ldexp(1.0, std::ilogb(magnitude));
}

namespace {

// The three values at flat index `flat` (fp64 tensors of one shape), with its index.
report::WorstElement element_at(int64_t flat, const at::Tensor& prod, const at::Tensor& base,
                                const at::Tensor& ref) {
  report::WorstElement e;
  e.index = unravel_index(flat, prod.sizes());
  e.prod = prod.view(-1)[flat].item<double>();
  e.ref = ref.view(-1)[flat].item<double>();
  e.base = base.view(-1)[flat].item<double>();
  return e;
}

}  // namespace

namespace {

// The figures of a ratio comparison from one pass over the elements of prod, base, ref and
// sigma (fp64, contiguous, one shape), with a second pass for the max rule, whose limit needs
// the baseline's error first: an ATen expression per figure would take some thirty passes over
// a large gradient, each writing a new tensor. The elements are taken in fixed chunks whose
// partial results combine in chunk order, so no figure depends on the thread count. Each element's
// arithmetic is that of the expression it replaces (IEEE operations without contraction), so
// maxima, counts and the worst element are the same bits; sums (means, norms) may differ from
// ATen's in their last bits by the order of addition, and a bin of the error histogram where
// std::log10 and ATen's differ by an ulp at a bin edge.
constexpr int64_t kScanChunk = int64_t{1} << 15;

struct ElementScan {
  int64_t prod_non_finite = 0, prod_first_non_finite = -1, base_non_finite = 0;
  double ref_max = 0;       // max |ref|; NaN when ref has one
  int64_t ref_argmax = -1;  // first index of it (of the first NaN)
  double diff_max = 0, diff_sum = 0;
  int64_t diff_argmax = -1;
  double floor_use = 0;  // max |prod - ref| / floor
  double base_max = 0, base_sum = 0, base_floor_use = 0;
  double ref_sq = 0, prod_sq = 0, err_sq = 0, dot = 0, floor_sum = 0;
  int64_t mismatches = 0;
  std::vector<int64_t> histogram = std::vector<int64_t>(report::kErrorBins, 0);
};

struct ScanInputs {
  const double *prod, *base, *ref, *sigma;
  int64_t numel;
  double rtol, atol;
};

double safe_floor_of(double sigma) {
  return std::max(sigma * kFloorSigmas, std::numeric_limits<double>::min());
}

// ATen's max and argmax: a NaN is larger than any number and the first NaN stays; else the
// first index wins a tie. A NaN in the floor (sigma) must fail a check as it did, wherever it is.
void take_max(double v, int64_t i, double& max, int64_t& arg) {
  if (arg < 0 || (!std::isnan(max) && (std::isnan(v) || v > max))) max = v, arg = i;
}

double nan_max(double a, double b) {
  return std::isnan(a) ? a : std::isnan(b) ? b : std::max(a, b);
}

ElementScan scan_chunk(const ScanInputs& in, int64_t begin, int64_t end) {
  ElementScan s;
  for (int64_t i = begin; i < end; ++i) {
    const double p = in.prod[i], b = in.base[i], r = in.ref[i], sigma = in.sigma[i];
    if (!std::isfinite(p) && s.prod_non_finite++ == 0) s.prod_first_non_finite = i;
    if (!std::isfinite(b)) ++s.base_non_finite;
    const double ar = std::abs(r);
    take_max(ar, i, s.ref_max, s.ref_argmax);
    const double floor = sigma * kFloorSigmas, safe = safe_floor_of(sigma);
    const double diff = std::abs(p - r);
    take_max(diff, i, s.diff_max, s.diff_argmax);
    s.diff_sum += diff;
    s.floor_use = nan_max(s.floor_use, diff / safe);
    s.floor_sum += floor;
    const double base_diff = std::abs(b - r);
    s.base_max = nan_max(s.base_max, base_diff);
    s.base_sum += base_diff;
    s.base_floor_use = nan_max(s.base_floor_use, base_diff / safe);
    s.ref_sq += r * r;
    s.prod_sq += p * p;
    s.err_sq += (p - r) * (p - r);
    s.dot += p * r;
    if (diff > ar * in.rtol + in.atol) ++s.mismatches;
    if (!std::isnan(diff)) {
      const double bin = std::floor((std::log10(std::max(diff, 1e-300)) - report::kErrorBinLow) /
                                    report::kErrorBinStep);
      ++s.histogram[static_cast<size_t>(std::clamp(bin, 0.0, report::kErrorBins - 1.0))];
    }
  }
  return s;
}

// Partial results in chunk order: the maxima keep the earlier chunk's index on a tie.
void combine(ElementScan& into, const ElementScan& c) {
  if (c.prod_non_finite > 0 && into.prod_non_finite == 0) {
    into.prod_first_non_finite = c.prod_first_non_finite;
  }
  into.prod_non_finite += c.prod_non_finite;
  into.base_non_finite += c.base_non_finite;
  if (c.ref_argmax >= 0) take_max(c.ref_max, c.ref_argmax, into.ref_max, into.ref_argmax);
  if (c.diff_argmax >= 0) take_max(c.diff_max, c.diff_argmax, into.diff_max, into.diff_argmax);
  into.diff_sum += c.diff_sum;
  into.floor_use = nan_max(into.floor_use, c.floor_use);
  into.base_max = nan_max(into.base_max, c.base_max);
  into.base_sum += c.base_sum;
  into.base_floor_use = nan_max(into.base_floor_use, c.base_floor_use);
  into.ref_sq += c.ref_sq;
  into.prod_sq += c.prod_sq;
  into.err_sq += c.err_sq;
  into.dot += c.dot;
  into.floor_sum += c.floor_sum;
  into.mismatches += c.mismatches;
  for (size_t b = 0; b < into.histogram.size(); ++b) into.histogram[b] += c.histogram[b];
}

// Runs `chunk(begin, end)` over fixed chunks on the intra-op threads; the parts in chunk order.
template <class Part, class Chunk>
std::vector<Part> by_chunks(int64_t numel, const Chunk& chunk) {
  const int64_t chunks = (numel + kScanChunk - 1) / kScanChunk;
  std::vector<Part> parts(static_cast<size_t>(chunks));
  at::parallel_for(0, chunks, 1, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      parts[c] = chunk(c * kScanChunk, std::min(numel, (c + 1) * kScanChunk));
    }
  });
  return parts;
}

ElementScan scan_elements(const ScanInputs& in) {
  ElementScan total;
  for (const auto& part : by_chunks<ElementScan>(
           in.numel, [&](int64_t b, int64_t e) { return scan_chunk(in, b, e); })) {
    combine(total, part);
  }
  return total;
}

// The max rule's worst element: the largest |prod - ref| / limit, limit = floor + base_term
// (the first index on a tie), and how many elements exceed their limit.
struct LimitScan {
  double score = 0;
  int64_t argmax = -1;
  int64_t over = 0;
};

LimitScan scan_limits(const ScanInputs& in, double base_term) {
  LimitScan total;
  const auto parts = by_chunks<LimitScan>(in.numel, [&](int64_t begin, int64_t end) {
    LimitScan s;
    for (int64_t i = begin; i < end; ++i) {
      const double diff = std::abs(in.prod[i] - in.ref[i]);
      const double limit = in.sigma[i] * kFloorSigmas + base_term;
      take_max(diff / std::max(limit, std::numeric_limits<double>::min()), i, s.score, s.argmax);
      if (diff > limit) ++s.over;
    }
    return s;
  });
  for (const auto& part : parts) {
    if (part.argmax >= 0) take_max(part.score, part.argmax, total.score, total.argmax);
    total.over += part.over;
  }
  return total;
}

}  // namespace

namespace {

// How a ratio comparison ended. The verdict (judge_ratio) fills the check's figures and the
// outcome; the message (ratio_message) is written from them alone.
enum class RatioOutcome {
  kPassed,
  kAttributes,     // prod's dtype or device (or no tensor)
  kShape,          // prod, base, ref or sigma of different shapes
  kOutOfRange,     // the exact value is beyond the output format: the case's fault
  kAllZero,        // the exact value is zero in prod's format: the case's fault
  kProdNonFinite,  // prod has NaN or Inf
  kNearOverflow,   // prod overflowed only within the floor of the boundary: the case's range
  kNotJudged,      // the floor's model does not hold here: the case's conditioning
  kDegenerate,     // prod is all zero where the exact value is not
  kZerosInFloor,   // prod is all zero, the exact value within its floor of zero everywhere
  kOverLimit,      // the rule's limit is exceeded
};

struct RatioJudgement {
  report::Check check;
  RatioOutcome outcome = RatioOutcome::kPassed;
  std::string attribute_failure;  // kAttributes: the mismatch, as assert_close words it
  std::vector<int64_t> prod_shape, base_shape, ref_shape;  // kShape
  double ref_max = 0;                                      // max |ref|
  int64_t prod_non_finite = 0, base_non_finite = 0;
  // Elements where prod overflowed to the exact value's sign within the floor of the format's
  // overflow boundary: left out of the verdict, and their first (kNearOverflow's message).
  int64_t left_out = 0;
  report::WorstElement first_left_out;
  double first_left_out_floor = 0;
  int64_t over = 0;  // elements over their own limit (max rule)
  // kZerosInFloor: the element whose exact value is nearest its floor, that floor and the ratio.
  report::WorstElement nearest_floor;
  double nearest_floor_value = 0, ref_to_floor = 0;
  double rtol = 0, atol = 0;
};

// The output format's overflow boundary: a value of at least this magnitude rounds to
// infinity, one below it to a finite value (max + half an ulp of max, where rounding to even
// gives infinity: max's significand is all ones).
double boundary_of(const RatioInputs& in) {
  return in.format_max + 0.5 * ulp(in.format_max, in.expected.dtype);
}

// What decides a check's state, found in turn: each is computed only where none before it
// holds (a wrong shape leaves nothing to scan), and left false where it is not reached.
struct RatioFacts {
  bool attributes_wrong = false;    // prod's dtype or device, or no tensor
  bool shape_wrong = false;         // prod, base, ref or sigma of different shapes
  bool ref_past_format = false;     // the exact value beyond the output format
  bool ref_zero_in_format = false;  // the exact value zero in prod's format
  bool prod_non_finite = false;     // NaN or Inf in prod, besides any left out
  bool degenerate = false;          // prod all zero where the exact value is not
  bool zeros_within_floor = false;  // ... every exact value within its finite floor of zero
  bool model_not_held = false;      // the floor's model does not hold here (not_judged)
  bool over_limit = false;          // an element past its limit (or not within it: NaN)
  bool left_out = false;            // elements overflowed within the floor of the boundary
};

// The states in their one order of precedence (docs/verification.md, "Verdict states"): the
// first whose fact holds is the check's. A wrong tensor fails before anything about the case;
// the case's range and zeros come before prod's infinities; all-zero prod is judged even where
// the floor's model does not hold (zeros bound nothing there), any other result is not; an
// element past its limit fails whatever was left out near the overflow boundary.
RatioOutcome state_of(const RatioFacts& f) {
  if (f.attributes_wrong) return RatioOutcome::kAttributes;
  if (f.shape_wrong) return RatioOutcome::kShape;
  if (f.ref_past_format) return RatioOutcome::kOutOfRange;
  if (f.ref_zero_in_format) return RatioOutcome::kAllZero;
  if (f.prod_non_finite) return RatioOutcome::kProdNonFinite;
  if (f.degenerate) {
    return f.zeros_within_floor ? RatioOutcome::kZerosInFloor : RatioOutcome::kDegenerate;
  }
  if (f.model_not_held) return RatioOutcome::kNotJudged;
  if (f.over_limit) return RatioOutcome::kOverLimit;
  if (f.left_out) return RatioOutcome::kNearOverflow;
  return RatioOutcome::kPassed;
}

// The figures of a check whose elements left out near the overflow boundary stand beside
// others within their limits: the left-out elements' (infinite errors, the first as the worst).
void report_left_out(RatioJudgement& j) {
  report::Check& check = j.check;
  check.worst = j.first_left_out;
  check.mismatches += j.left_out;
  check.max_abs = std::numeric_limits<double>::infinity();
  check.mean_abs = std::numeric_limits<double>::infinity();
  check.error_to_limit = std::numeric_limits<double>::infinity();
}

// The state's verdict on the check: passed, failed, or not judged (out of range). Prod's
// infinities are the case's range only where a careful implementation overflows too.
RatioJudgement settled(RatioJudgement j, const RatioFacts& f, const RatioInputs& in) {
  j.outcome = state_of(f);
  report::Check& check = j.check;
  check.passed = j.outcome == RatioOutcome::kPassed;
  switch (j.outcome) {
    case RatioOutcome::kOutOfRange:
    case RatioOutcome::kAllZero:
    case RatioOutcome::kZerosInFloor:
      check.out_of_range = true;
      break;
    case RatioOutcome::kNotJudged:
      check.out_of_range = true;
      // Elements left out near the boundary, the rest within limits: their figures, as below.
      if (f.left_out && !f.over_limit) report_left_out(j);
      break;
    case RatioOutcome::kProdNonFinite:
      check.out_of_range = !in.model_overflow.empty();
      break;
    case RatioOutcome::kNearOverflow:
      // The rest within its limits: the case's range decides.
      check.out_of_range = true;
      report_left_out(j);
      break;
    default:
      check.out_of_range = false;
  }
  return j;
}

// The verdict and its figures, no text but the check's note.
RatioJudgement judge_ratio(const RatioInputs& in) {
  RatioJudgement j;
  RatioFacts facts;
  report::Check& check = j.check;
  check.path = in.path;
  check.compared = "prod and the plain baseline in the case's dtypes vs fp64 reference";
  check.gate_on_mean = in.statistic == ErrorStatistic::kMeanAbs;
  if (auto wrong = attribute_mismatch(in.path, in.prod, in.expected)) {
    check.numel = in.prod.defined() ? in.prod.numel() : 0;
    check.mismatches = check.numel;
    j.attribute_failure = *wrong;
    facts.attributes_wrong = true;
    return settled(std::move(j), facts, in);
  }
  auto prod = in.prod.detach().cpu().to(at::kDouble).contiguous();
  auto base = in.base.detach().cpu().to(at::kDouble).contiguous();
  const auto ref = in.ref.detach().cpu().to(at::kDouble).contiguous();
  const auto sigma = in.sigma.detach().cpu().to(at::kDouble).contiguous();
  check.numel = prod.numel();
  if (prod.sizes() != ref.sizes() || base.sizes() != ref.sizes() || sigma.sizes() != ref.sizes()) {
    check.mismatches = check.numel;
    j.prod_shape = prod.sizes().vec();
    j.base_shape = base.sizes().vec();
    j.ref_shape = ref.sizes().vec();
    facts.shape_wrong = true;
    return settled(std::move(j), facts, in);
  }
  if (in.keep_tensors) {
    check.tensors = report::CheckTensors{
        bridge::to_tensor_data(in.prod), bridge::to_tensor_data(in.base),
        bridge::to_tensor_data(ref), bridge::to_tensor_data(sigma * kFloorSigmas)};
  }
  std::tie(j.rtol, j.atol) = report::assert_close_tolerances(
      bridge::dtype_name(in.prod.scalar_type()), bridge::dtype_name(in.expected.dtype));
  ScanInputs elements{prod.data_ptr<double>(),
                      base.data_ptr<double>(),
                      ref.data_ptr<double>(),
                      sigma.data_ptr<double>(),
                      check.numel,
                      j.rtol,
                      j.atol};
  ElementScan scan = scan_elements(elements);
  // The exact result must be representable in the output format.
  const double boundary = boundary_of(in);
  j.ref_max = check.numel ? scan.ref_max : 0.0;
  if (!std::isfinite(j.ref_max) || j.ref_max >= boundary) {
    check.worst = element_at(scan.ref_argmax, prod, base, ref);
    facts.ref_past_format = true;
    return settled(std::move(j), facts, in);
  }
  // A reference that is zero in prod's format (alpha 0, a dropout that drops every token, a
  // scale so small every value underflows) cannot tell a correct kernel from one that returns
  // zeros: the case cannot be judged there (docs/verification.md, "Verdict states"), which is
  // the case's fault, not a verdict on prod. Rounding is monotone in magnitude: some element
  // rounds to a nonzero value exactly when the largest does.
  if (check.numel > 0 &&
      at::scalar_tensor(j.ref_max, at::kDouble).to(in.prod.scalar_type()).item<double>() == 0) {
    facts.ref_zero_in_format = true;
    return settled(std::move(j), facts, in);
  }
  // Where the exact value lies within a careful implementation's rounding (the floor) of the
  // overflow boundary, such an implementation may overflow too: an infinity of the exact
  // value's sign there is left out of the verdict, which the other elements then decide
  // (docs/verification.md, "Verdict states").
  const auto may_overflow = [&](int64_t i) {
    const double p = elements.prod[i], r = elements.ref[i];
    return std::isinf(p) && std::signbit(p) == std::signbit(r) &&
           std::abs(r) + safe_floor_of(elements.sigma[i]) >= boundary;
  };
  if (scan.prod_non_finite > 0 && in.model_overflow.empty()) {
    bool all = true;
    for (int64_t i = 0; i < check.numel && all; ++i) {
      if (!std::isfinite(elements.prod[i])) all = may_overflow(i);
    }
    if (all) {
      j.left_out = scan.prod_non_finite;
      j.first_left_out = element_at(scan.prod_first_non_finite, prod, base, ref);
      j.first_left_out_floor = elements.sigma[scan.prod_first_non_finite] * kFloorSigmas;
      prod = prod.clone();
      base = base.clone();
      double* const pp = prod.data_ptr<double>();
      double* const bp = base.data_ptr<double>();
      for (int64_t i = 0; i < check.numel; ++i) {
        if (!std::isfinite(pp[i])) pp[i] = bp[i] = elements.ref[i];
      }
      elements.prod = pp;
      elements.base = bp;
      scan = scan_elements(elements);
    }
  }
  j.prod_non_finite = scan.prod_non_finite;
  j.base_non_finite = scan.base_non_finite;
  if (j.prod_non_finite > 0) {
    check.worst = element_at(scan.prod_first_non_finite, prod, base, ref);
    check.mismatches = j.prod_non_finite;
    check.max_abs = std::numeric_limits<double>::infinity();
    check.mean_abs = std::numeric_limits<double>::infinity();
    check.error_to_limit = std::numeric_limits<double>::infinity();
    facts.prod_non_finite = true;
    return settled(std::move(j), facts, in);
  }
  check.error_histogram = scan.histogram;
  const double n = static_cast<double>(check.numel);
  check.max_abs = check.numel ? scan.diff_max : 0.0;
  check.mean_abs = check.numel ? scan.diff_sum / n : 0.0;
  if (check.numel > 0) check.floor_use = scan.floor_use;
  double base_term = 0;
  if (j.base_non_finite > 0) {
    // Judged on its own: the baseline's error says nothing when it overflowed.
    check.note = "base has " + std::to_string(j.base_non_finite) +
                 " non-finite elements (it overflowed where prod did not): prod is judged "
                 "against the floor alone";
  } else {
    if (check.numel > 0) check.baseline_floor_use = scan.base_floor_use;
    check.baseline_max_abs = check.numel ? scan.base_max : 0.0;
    check.baseline_mean_abs = check.numel ? scan.base_sum / n : 0.0;
    base_term = in.ratio * *check.gated_baseline_error();
  }
  const double ref_norm = std::sqrt(scan.ref_sq), prod_norm = std::sqrt(scan.prod_sq);
  check.rel_fro = ref_norm > 0 ? std::sqrt(scan.err_sq) / ref_norm : 0.0;
  check.cosine = ref_norm > 0 && prod_norm > 0 ? scan.dot / (prod_norm * ref_norm) : 0.0;
  check.mismatches = scan.mismatches;
  if (check.numel > 0) {
    if (check.gate_on_mean) {
      // The mean error against the mean limit: every element within its own limit keeps the
      // mean within theirs.
      const double mean_floor = scan.floor_sum / n;
      check.limit = base_term + mean_floor;
      check.floor = mean_floor;
      check.error_to_limit =
          check.limit > 0 ? check.mean_abs / check.limit : (check.mean_abs > 0 ? INFINITY : 0.0);
      check.worst = element_at(scan.diff_argmax, prod, base, ref);
    } else {
      // The worst element is the one nearest (or furthest past) its own limit.
      const LimitScan limits = scan_limits(elements, base_term);
      const int64_t flat = limits.argmax;
      check.worst = element_at(flat, prod, base, ref);
      const double floor = sigma.data_ptr<double>()[flat] * kFloorSigmas;
      check.limit = floor + base_term;
      check.floor = floor;
      check.error_to_limit = limits.score;
      j.over = limits.over;
    }
  }
  facts.degenerate = prod_norm == 0;
  // Past the limit, or not within it: a NaN (a NaN floor) fails.
  facts.over_limit = !(check.error_to_limit.value_or(0) <= 1.0);
  facts.model_not_held = !in.not_judged.empty();
  facts.left_out = j.left_out > 0;
  // Zeros where every exact value lies within its finite floor of zero are a result a careful
  // implementation may return (an intermediate that underflows in the case's dtypes): such a
  // check cannot tell prod from a kernel that returns zeros, and the case is the cause
  // (docs/verification.md, "Verdict states"). The baseline is one careful implementation, not
  // the test: its rounding may land on subnormals where another's lands on zero. Not where the
  // floor's model does not hold: there its floors bound nothing, and zeros fail.
  if (facts.degenerate && check.numel > 0 && !facts.model_not_held) {
    int64_t nearest = -1;
    double share_max = 0;
    for (int64_t i = 0; i < check.numel; ++i) {
      const double r = std::abs(elements.ref[i]), floor = elements.sigma[i] * kFloorSigmas;
      if (!(r <= floor) || !std::isfinite(floor)) {
        nearest = -1;
        break;
      }
      const double share = r > 0 ? r / floor : 0.0;
      if (nearest < 0 || share > share_max) share_max = share, nearest = i;
    }
    if (nearest >= 0) {
      j.nearest_floor = element_at(nearest, prod, base, ref);
      j.nearest_floor_value = elements.sigma[nearest] * kFloorSigmas;
      j.ref_to_floor = share_max;
      facts.zeros_within_floor = true;
    }
  }
  if (facts.left_out) {
    const std::string left =
        std::to_string(j.left_out) + " element" + (j.left_out == 1 ? "" : "s") +
        " where prod overflowed within the floor of " + in.format + "'s overflow boundary left out";
    check.note = check.note.empty() ? left : check.note + "; " + left;
  }
  return settled(std::move(j), facts, in);
}

// The failure message, torch.testing.assert_close's shape: what failed and by how much, the
// rule's terms, the mismatch count and the worst element.
std::string ratio_message(const RatioInputs& in, const RatioJudgement& j) {
  const report::Check& check = j.check;
  const std::string& path = in.path;
  std::ostringstream msg;
  switch (j.outcome) {
    case RatioOutcome::kPassed:
      return "";
    case RatioOutcome::kAttributes:
      return j.attribute_failure;
    case RatioOutcome::kShape:
      msg << path << ": the values for attribute 'shape' do not match: prod "
          << at::IntArrayRef(j.prod_shape) << ", base " << at::IntArrayRef(j.base_shape)
          << ", expected " << at::IntArrayRef(j.ref_shape);
      return msg.str();
    case RatioOutcome::kOutOfRange:
      msg << path << ": out of range for " << in.format
          << ": the exact value reaches |ref| = " << format_exact(j.ref_max) << " at index "
          << format_index(check.worst->index) << ", beyond " << in.format
          << "'s largest finite value " << format_exact(in.format_max) << "; no correct "
          << in.format << " output holds it (the case, not the kernel)";
      return msg.str();
    case RatioOutcome::kAllZero:
      msg << path << ": cannot be judged: the exact value is "
          << (j.ref_max == 0
                  ? "all zero"
                  : "all zero in " + in.format + " (max |ref| " + format_exact(j.ref_max) + ")")
          << ", so a kernel that returns zeros would pass; the case, not the kernel (make alpha, "
             "the dropout or the shape such that the gradient is not zero)";
      return msg.str();
    case RatioOutcome::kProdNonFinite: {
      const auto& w = *check.worst;
      msg << path << ": prod has " << j.prod_non_finite << " non-finite element"
          << (j.prod_non_finite == 1 ? "" : "s") << " (NaN or Inf) of " << check.numel
          << "; first at index " << format_index(w.index) << ": prod " << format_exact(w.prod)
          << ", base " << format_exact(*w.base) << ", ref " << format_exact(w.ref);
      if (!in.model_overflow.empty()) {
        const std::string& f = in.model_format.empty() ? in.format : in.model_format;
        msg << "; a careful implementation overflows too (" << in.model_overflow
            << "): the case is out of range for " << f << ", not a verdict on prod";
      } else {
        msg << "; the exact result is finite and within " << in.format << " range (max |ref| "
            << format_exact(j.ref_max) << ")"
            << (j.base_non_finite ? " (base overflows as well)" : "");
      }
      return msg.str();
    }
    case RatioOutcome::kNearOverflow: {
      const auto& w = j.first_left_out;
      msg << path << ": prod has " << j.left_out << " infinite element"
          << (j.left_out == 1 ? "" : "s") << " of " << check.numel
          << ", each where the exact value lies within a careful implementation's rounding of "
          << in.format << "'s overflow boundary " << format_exact(boundary_of(in))
          << ": first at index " << format_index(w.index) << ": prod " << format_exact(w.prod)
          << ", base " << format_exact(*w.base) << ", ref " << format_exact(w.ref) << ", floor "
          << format_exact(j.first_left_out_floor)
          << "; a careful implementation may overflow there too, and every other element is "
             "within its limit: the case is out of range for "
          << in.format << ", not a verdict on prod";
      return msg.str();
    }
    case RatioOutcome::kNotJudged:
      msg << path << ": cannot be judged: " << in.not_judged << "; "
          << (check.gate_on_mean ? "mean" : "max") << " |prod - ref| "
          << format_exact(check.gate_on_mean ? check.mean_abs : check.max_abs) << ", "
          << (check.gate_on_mean ? "mean" : "max") << " |base - ref| "
          << format_exact(check.gate_on_mean ? check.baseline_mean_abs.value_or(0)
                                             : check.baseline_max_abs.value_or(0))
          << ", error / limit as if judged " << format_exact(check.error_to_limit.value_or(0));
      return msg.str();
    case RatioOutcome::kZerosInFloor: {
      const auto& w = j.nearest_floor;
      msg << path << ": cannot be judged: prod is all zero, and every element of the exact "
          << "value lies within a careful implementation's rounding of zero (the nearest to its "
          << "floor at index " << format_index(w.index) << ": ref " << format_exact(w.ref)
          << ", floor " << format_exact(j.nearest_floor_value) << ", |ref| / floor "
          << format_exact(j.ref_to_floor) << "; max |ref| " << format_exact(j.ref_max)
          << "), which such an implementation may return where an intermediate underflows in "
             "the case's dtypes; the case, not the kernel (raise x_scale or loss_scale, or widen "
             "the dtype)";
      return msg.str();
    }
    case RatioOutcome::kDegenerate:
      msg << path << ": degenerate: prod is all zero where the exact value is not (max |ref| "
          << format_exact(j.ref_max) << "; a zero gradient is a failure, not a pass)";
      return msg.str();
    case RatioOutcome::kOverLimit:
      break;
  }
  const auto& w = *check.worst;
  const char* setter = *check.floor >= check.limit - *check.floor ? "the floor" : "the base term";
  const std::string model = in.precision.empty() ? in.format : in.precision;
  if (check.gate_on_mean) {
    msg << path << ": mean |prod - ref| " << format_exact(check.mean_abs) << " > limit "
        << format_exact(check.limit) << " = " << in.ratio << " x mean |base - ref| "
        << format_exact(check.baseline_mean_abs.value_or(0)) << " + mean floor "
        << format_exact(*check.floor) << " (" << kFloorSigmas
        << " sigma of a careful implementation's rounding, " << model << "); " << setter
        << " set the limit\n";
  } else {
    msg << path << ": |prod - ref| " << format_exact(std::abs(w.prod - w.ref)) << " at index "
        << format_index(w.index) << " > limit " << format_exact(check.limit) << " = " << in.ratio
        << " x err(base) " << format_exact(check.baseline_max_abs.value_or(0)) << " + floor "
        << format_exact(*check.floor) << " (" << kFloorSigmas
        << " sigma of a careful implementation's rounding there, " << model << "); " << setter
        << " set the limit\n"
        << "        Elements over their limit: " << j.over << " / " << check.numel << "\n";
  }
  char pct[32];
  std::snprintf(pct, sizeof pct, "%.3g%%", 100.0 * check.mismatches / check.numel);
  msg << "        Mismatched elements (assert_close rtol " << j.rtol << ", atol " << j.atol
      << "): " << check.mismatches << " / " << check.numel << " (" << pct << ")\n"
      << "        Greatest absolute difference: " << format_exact(check.max_abs) << "\n"
      << "        at " << format_index(w.index) << ": prod " << format_exact(w.prod) << ", base "
      << format_exact(*w.base) << ", ref " << format_exact(w.ref) << "; relative Frobenius error "
      << format_exact(*check.rel_fro) << ", cosine " << format_exact(*check.cosine);
  if (!check.note.empty()) msg << "\n        " << check.note;
  return msg.str();
}

}  // namespace

report::Check compare_ratio(const RatioInputs& in) {
  RatioJudgement j = judge_ratio(in);
  j.check.failure = ratio_message(in, j);
  return std::move(j.check);
}

report::Check expect_rejection(const std::string& path, const std::string& compared, bool rejected,
                               const std::string& detail) {
  report::Check check;
  check.path = path;
  check.exact = true;
  check.compared = compared;
  check.numel = 1;
  check.mismatches = rejected ? 0 : 1;
  check.max_abs = rejected ? 0 : 1;
  check.passed = rejected;
  if (!rejected) {
    check.failure = path + ": expected a refusal (" + compared + ") but the operation proceeded" +
                    (detail.empty() ? "" : "; " + detail);
  }
  return check;
}

}  // namespace gradscope

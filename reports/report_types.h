// Result records: plain structs that every report writer consumes. A writer
// formats these; it never recomputes a metric.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

namespace gradscope::report {

// A resolved case-file field: TOML integer, float, boolean or string.
using SpecValue = std::variant<int64_t, double, bool, std::string>;
using SpecFields = std::vector<std::pair<std::string, SpecValue>>;

std::string format_spec_value(const SpecValue& value);
// Three significant digits, as the console and HTML tables print figures.
std::string format_number(double value);

// A check's status and a case's outcome: what every report writes (status() gives the word).
enum class CheckStatus { kPass, kFail, kOutOfRange };
enum class Outcome { kPass, kFail, kInvalid, kUnsupported };
const char* status_name(CheckStatus status);  // pass, fail, out_of_range
const char* outcome_name(Outcome outcome);    // pass, fail, invalid, unsupported

// torch.testing.assert_close's default (rtol, atol) for a dtype name (fp16, bf16, fp32,
// fp64; anything else gets fp32's); mixed dtypes take the looser pair.
std::pair<double, double> assert_close_tolerances(const std::string& dtype);
std::pair<double, double> assert_close_tolerances(const std::string& a, const std::string& b);

// A tensor's values for dumps. fp64 holds every value of the dtypes used here exactly
// (fp32, fp16, bf16, fp64 up to rounding-free copies; int32 and bool).
struct TensorData {
  std::string dtype;  // fp32 fp16 bf16 fp64 int32 int64 bool
  std::vector<int64_t> shape;
  std::vector<double> values;  // row-major
};

// The three implementations' versions of one compared tensor.
struct CheckTensors {
  TensorData prod;
  std::optional<TensorData> base;
  TensorData ref;
  std::optional<TensorData> floor;  // the floor of each element (ratio checks)
};

// The element where prod is furthest from the reference.
struct WorstElement {
  std::vector<int64_t> index;
  double prod = 0;
  double ref = 0;                  // the reference as compared (rounded in exact mode)
  std::optional<double> ref_fp64;  // the unrounded fp64 reference, where it differs
  std::optional<double> base;      // the plain baseline in the case's dtypes, where there is one
  std::string detail;              // what the element is, e.g. "code 7, zero 8, group 3"
};

struct Check {
  std::string path;  // <case id>/<layer>/<module>/<projection>/<tensor>
  bool passed = false;
  // The output format cannot hold the exact result (or a careful implementation overflows
  // with prod): the case is out of range, not a verdict on prod (docs/verification.md).
  bool out_of_range = false;
  bool exact = false;    // bit-exact comparison, no tolerance
  std::string compared;  // what was compared with what, in words
  int64_t numel = 0;
  int64_t mismatches = 0;  // exact: differing elements; else outside assert_close's default
  double max_abs = 0;      // max |prod - ref|
  double mean_abs = 0;
  std::optional<double> baseline_max_abs;   // max |base - ref|; none for exact checks
  std::optional<double> baseline_mean_abs;  // mean |base - ref|; none for exact checks
  // The ratio rule's err(): the max |x - ref| (default) or, where the per-element errors
  // are heavy-tailed, the mean.
  bool gate_on_mean = false;
  // The limit at the worst element: ratio x err(base) + floor there (the largest error that
  // element may have; with the mean statistic, the largest mean error that passes).
  double limit = 0;
  std::optional<double> floor;           // the floor term of `limit` (ratio checks)
  std::optional<double> error_to_limit;  // max over elements of |prod - ref| / limit (<= 1 passes)
  // max over elements of |x - ref| / floor: how much of a careful implementation's rounding
  // allowance prod and the baseline use (reported even when passing, so drift shows early).
  std::optional<double> floor_use, baseline_floor_use;
  std::string note;               // e.g. "base overflowed: prod judged on the floor alone"
  std::optional<double> rel_fro;  // ||prod - ref|| / ||ref||
  std::optional<double> cosine;   // <prod, ref> / (||prod|| ||ref||)
  std::optional<WorstElement> worst;
  std::string failure;                  // assert_close-style message; empty when passed
  std::optional<CheckTensors> tensors;  // kept only when a dump was asked for
  // Distribution of |prod - ref| over the elements (ratio checks): bin i counts errors in
  // [10^(kErrorBinLow + i kErrorBinStep), 10^(kErrorBinLow + (i+1) kErrorBinStep)); the
  // first bin also takes exact zeros and anything smaller, the last anything larger.
  std::vector<int64_t> error_histogram;

  // End to end (harness/verdict/end_to_end_rule.h): the statistic the rule gates on where it is
  // neither of those ("frobenius": ||prod - ref||, "abs": a scalar's |prod - ref|) and its value.
  std::string statistic_name;
  double statistic_value = 0;

  double gated_error() const {
    return !statistic_name.empty() ? statistic_value : gate_on_mean ? mean_abs : max_abs;
  }
  // What the rule compares with `limit`: exact, max_abs, mean_abs, frobenius or abs.
  std::string statistic() const {
    return exact                     ? "exact"
           : !statistic_name.empty() ? statistic_name
           : gate_on_mean            ? "mean_abs"
                                     : "max_abs";
  }
  CheckStatus status_code() const {
    return passed         ? CheckStatus::kPass
           : out_of_range ? CheckStatus::kOutOfRange
                          : CheckStatus::kFail;
  }
  const char* status() const { return status_name(status_code()); }
  std::optional<double> gated_baseline_error() const {
    return gate_on_mean ? baseline_mean_abs : baseline_max_abs;
  }
};

inline constexpr double kErrorBinLow = -10.0;
inline constexpr double kErrorBinStep = 0.5;
inline constexpr int kErrorBins = 28;  // up to 10^4

// A training case's curves, one entry per optimizer step (taken before the step updates
// the adapters): the mean loss and the L2 norm over every adapter gradient.
struct LossCurve {
  std::vector<double> prod, base, ref;
  std::vector<double> grad_norm_prod, grad_norm_base, grad_norm_ref;
  std::optional<int64_t> divergence_step;  // first step whose loss check failed
};

struct CaseResult {
  std::string id;
  std::string kind;
  std::string source;     // case file the case came from
  SpecFields spec;        // resolved fields, named as in the case file
  std::string spec_toml;  // the same, as case-file text
  std::vector<std::pair<std::string, TensorData>> inputs;  // generated inputs, when kept
  std::vector<Check> checks;
  std::string replay;  // command that runs just this case
  // Figures reported, not gated: peak memory, timings.
  std::vector<std::pair<std::string, double>> metrics;
  std::optional<LossCurve> loss_curve;  // training cases
  double seconds = 0;
  // Set when the case could not be judged because of its input (a field, a file, or a
  // result its formats cannot hold): the run exits 2, not 1.
  std::string input_error;
  // Set when the implementation under test declined the case (it lacks a feature the case
  // uses): counted apart from failures, and the run's exit code does not count it.
  std::string unsupported;

  bool passed() const {
    if (!input_error.empty() || !unsupported.empty()) return false;
    for (const auto& c : checks) {
      if (!c.passed) return false;
    }
    return !checks.empty();
  }
  bool invalid() const { return !input_error.empty(); }
  bool is_unsupported() const { return input_error.empty() && !unsupported.empty(); }
  Outcome outcome() const {
    return passed()           ? Outcome::kPass
           : invalid()        ? Outcome::kInvalid
           : is_unsupported() ? Outcome::kUnsupported
                              : Outcome::kFail;
  }
  const char* status() const { return outcome_name(outcome()); }
};

struct Environment {
  std::string device;
  std::string commit;
  std::optional<std::string> gpu;
  std::string torch;
  std::optional<std::string> cuda;
  std::string compiler;
};

// The implementation under test: the operator namespace prod was called in
// (docs/implementations.md) and the libraries loaded to register it.
struct Implementation {
  std::string ns = "gradscope";
  int schema_version = 0;
  std::vector<std::string> libraries;
  // "gradscope (built in)" or "myns (schema 2; libmyops.so)"
  std::string describe() const;
};

struct RunReport {
  std::string tool = "gradscope";
  std::string version;
  Environment environment;
  Implementation implementation;
  std::vector<CaseResult> cases;

  int64_t passed() const;
  int64_t invalid() const;
  int64_t unsupported() const;
  // Cases whose checks failed (kernel verdicts); invalid and unsupported cases are counted apart.
  int64_t failed() const {
    return static_cast<int64_t>(cases.size()) - passed() - invalid() - unsupported();
  }
};

}  // namespace gradscope::report

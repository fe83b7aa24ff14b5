#include "reports/console_report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <string>

namespace gradscope::report {
namespace {

// One row per projection x tensor: the ratio rule's inputs and verdict.
void print_ratio_table(std::ostream& out, const CaseResult& r) {
  char line[512];
  std::snprintf(line, sizeof line, "      %-42s %10s %10s %10s %9s %10s %9s %10s  %s\n", "tensor",
                "err(prod)", "err(base)", "floor", "err/limit", "mean_abs", "rel_fro", "cosine",
                "status");
  out << line;
  for (const auto& c : r.checks) {
    if (!c.floor) continue;
    const std::string name =
        c.path.rfind(r.id + "/", 0) == 0 ? c.path.substr(r.id.size() + 1) : c.path;
    // err(base) is "-" where the baseline overflowed and prod was judged on the floor alone.
    char base[16] = "-";
    if (const auto b = c.gated_baseline_error()) std::snprintf(base, sizeof base, "%.3g", *b);
    std::snprintf(line, sizeof line,
                  "      %-42s %10.3g %10s %10.3g %9.3g %10.3g %9.2g %10.7f  %s\n", name.c_str(),
                  c.gated_error(), base, *c.floor, c.error_to_limit.value_or(0), c.mean_abs,
                  c.rel_fro.value_or(0), c.cosine.value_or(0),
                  c.passed         ? "pass"
                  : c.out_of_range ? "not judged"
                                   : "FAIL");
    out << line;
  }
}

// Every k-th step of a training case's curves (about ten rows, the last step always).
void print_loss_curve(std::ostream& out, const LossCurve& curve) {
  char line[256];
  std::snprintf(line, sizeof line, "      %5s %12s %12s %12s %10s %10s %11s %11s\n", "step",
                "loss(prod)", "loss(base)", "loss(ref)", "|prod-ref|", "|base-ref|", "gnorm(prod)",
                "gnorm(ref)");
  out << line;
  const size_t n = curve.prod.size(), stride = std::max<size_t>(1, n / 10);
  for (size_t i = 0; i < n; ++i) {
    if (i % stride != 0 && i + 1 != n) continue;
    std::snprintf(
        line, sizeof line, "      %5zu %12.6f %12.6f %12.6f %10.3g %10.3g %11.4g %11.4g\n", i,
        curve.prod[i], curve.base[i], curve.ref[i], std::abs(curve.prod[i] - curve.ref[i]),
        std::abs(curve.base[i] - curve.ref[i]), curve.grad_norm_prod[i], curve.grad_norm_ref[i]);
    out << line;
  }
}

}  // namespace

void print_case(std::ostream& out, const CaseResult& r, const ConsoleOptions& options) {
  const bool passed = r.passed();
  if (options.quiet && passed) return;
  double worst = 0;
  for (const auto& c : r.checks) worst = std::max(worst, c.max_abs);
  // A check the case could not judge (out of range) is not a failed check.
  const auto failed = std::count_if(r.checks.begin(), r.checks.end(),
                                    [](const Check& c) { return !c.passed && !c.out_of_range; });
  const auto not_judged = std::count_if(r.checks.begin(), r.checks.end(),
                                        [](const Check& c) { return c.out_of_range; });
  char line[512];
  std::snprintf(line, sizeof line, "%s  %-60s %3zu checks  %3ld failed  max_abs %-9s %6.2fs",
                passed               ? "PASS"
                : r.invalid()        ? "INVALID"
                : r.is_unsupported() ? "UNSUPPORTED"
                                     : "FAIL",
                r.id.c_str(), r.checks.size(), static_cast<long>(failed),
                format_number(worst).c_str(), r.seconds);
  out << line;
  if (not_judged > 0) out << "  " << not_judged << " not judged";
  out << '\n';
  if (r.invalid()) {
    out << "      not judged: " << r.input_error << '\n';
  } else if (r.is_unsupported()) {
    out << "      not run by the implementation under test: " << r.unsupported << '\n';
  } else if (r.checks.empty()) {
    out << "      no checks ran (a case without checks is a failure)\n";
  }
  const bool has_ratio_checks = std::any_of(r.checks.begin(), r.checks.end(),
                                            [](const Check& c) { return c.floor.has_value(); });
  if (has_ratio_checks && !options.quiet) print_ratio_table(out, r);
  if (r.loss_curve) {
    if (!options.quiet) print_loss_curve(out, *r.loss_curve);
    out << "      "
        << (r.loss_curve->divergence_step
                ? "prod's loss leaves the band at step " +
                      std::to_string(*r.loss_curve->divergence_step)
                : std::string("prod's loss stays in the band at every step"))
        << '\n';
  }
  for (const auto& c : r.checks) {
    if (c.passed || (r.invalid() && c.failure == r.input_error)) continue;
    out << "      " << c.failure;
    if (!c.failure.empty() && c.failure.back() != '\n') out << '\n';
  }
  for (const auto& [name, value] : r.metrics) {
    if (!options.quiet) out << "      " << name << " " << format_number(value) << '\n';
  }
  if (!passed && !r.is_unsupported()) out << "      replay: " << r.replay << '\n';
}

void print_summary(std::ostream& out, const RunReport& report) {
  struct Counts {
    int64_t passed = 0, failed = 0, invalid = 0, unsupported = 0;
  };
  std::map<std::string, Counts> by_kind;
  int64_t checks = 0, failed_checks = 0, not_judged = 0;
  for (const auto& c : report.cases) {
    auto& counts = by_kind[c.kind];
    (c.passed()           ? counts.passed
     : c.invalid()        ? counts.invalid
     : c.is_unsupported() ? counts.unsupported
                          : counts.failed) += 1;
    for (const auto& check : c.checks) {
      ++checks;
      failed_checks += check.passed || check.out_of_range ? 0 : 1;
      not_judged += check.out_of_range ? 1 : 0;
    }
  }
  out << "\n";
  for (const auto& [kind, counts] : by_kind) {
    out << "  " << kind << ": " << counts.passed << " passed, " << counts.failed << " failed";
    if (counts.invalid) out << ", " << counts.invalid << " invalid";
    if (counts.unsupported) out << ", " << counts.unsupported << " unsupported";
    out << "\n";
  }
  out << "  checks: " << checks - failed_checks - not_judged << " passed, " << failed_checks
      << " failed";
  if (not_judged) out << ", " << not_judged << " not judged";
  out << "\n";
  out << report.passed() << " passed, " << report.failed() << " failed";
  if (report.invalid()) out << ", " << report.invalid() << " invalid (not judged)";
  if (report.unsupported()) {
    out << ", " << report.unsupported() << " unsupported by " << report.implementation.ns;
  }
  out << "\n";
  if (report.implementation.ns != "gradscope" || !report.implementation.libraries.empty()) {
    out << "implementation under test: " << report.implementation.describe() << "\n";
  }
}

}  // namespace gradscope::report

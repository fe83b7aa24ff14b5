#include "reports/html_report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

#include "reports/markup_escape.h"

namespace gradscope::report {
namespace {

// Cosines of good results are 0.99999...: three digits would say 1.
std::string cosine_text(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.7f", v);
  return buf;
}

// err(prod) against err(base) of every ratio check, log-log, with the lines y = x and
// y = 2x: a correct kernel sits near the first, the rule allows up to the second.
std::string scatter_svg(const std::vector<const Check*>& checks) {
  const double w = 420, h = 320, m = 46;
  double lo = 0, hi = 0;
  bool first = true;
  for (const auto* c : checks) {
    for (double v : {*c->gated_baseline_error(), c->gated_error()}) {
      if (v <= 0) continue;
      const double l = std::log10(v);
      lo = first ? l : std::min(lo, l);
      hi = first ? l : std::max(hi, l);
      first = false;
    }
  }
  if (first) return "";
  lo = std::floor(lo - 0.2);
  hi = std::ceil(hi + 0.5);
  const auto X = [&](double v) { return m + (std::log10(v) - lo) / (hi - lo) * (w - 2 * m); };
  const auto Y = [&](double v) { return h - m - (std::log10(v) - lo) / (hi - lo) * (h - 2 * m); };
  std::ostringstream s;
  s << "<svg class=\"plot\" width=\"" << w << "\" height=\"" << h << "\" viewBox=\"0 0 " << w << " "
    << h
    << "\" xmlns=\"http://www.w3.org/2000/svg\" role=\"img\"><title>err(prod) vs err(base)</title>"
    << "<rect x=\"" << m << "\" y=\"" << m << "\" width=\"" << w - 2 * m << "\" height=\""
    << h - 2 * m << "\" fill=\"#fafafa\" stroke=\"#999\"/>";
  for (int d = static_cast<int>(lo); d <= static_cast<int>(hi); ++d) {
    const double v = std::pow(10.0, d);
    s << "<text x=\"" << X(v) << "\" y=\"" << h - m + 16
      << "\" font-size=\"10\" text-anchor=\"middle\">1e" << d << "</text><text x=\"" << m - 4
      << "\" y=\"" << Y(v) + 3 << "\" font-size=\"10\" text-anchor=\"end\">1e" << d << "</text>";
  }
  const double a = std::pow(10.0, lo), b = std::pow(10.0, hi);
  s << "<line x1=\"" << X(a) << "\" y1=\"" << Y(a) << "\" x2=\"" << X(b) << "\" y2=\"" << Y(b)
    << "\" stroke=\"#4a4\" stroke-dasharray=\"4 3\"/>";
  s << "<line x1=\"" << X(a) << "\" y1=\"" << Y(2 * a) << "\" x2=\"" << X(b / 2) << "\" y2=\""
    << Y(b) << "\" stroke=\"#c44\" stroke-dasharray=\"2 2\"/>";
  for (const auto* c : checks) {
    if (*c->gated_baseline_error() <= 0 || c->gated_error() <= 0) continue;
    s << "<circle cx=\"" << X(*c->gated_baseline_error()) << "\" cy=\"" << Y(c->gated_error())
      << "\" r=\"3.5\" fill=\"" << (c->passed ? "#2a6fdb" : "#d22")
      << "\" fill-opacity=\"0.7\"><title>" << escape_markup(c->path) << ": err(prod) "
      << format_number(c->gated_error()) << ", err(base) "
      << format_number(*c->gated_baseline_error()) << "</title></circle>";
  }
  s << "<text x=\"" << w / 2 << "\" y=\"" << h - 8
    << "\" font-size=\"11\" text-anchor=\"middle\">err(base) = max |base - ref|</text>"
    << "<text x=\"12\" y=\"" << h / 2
    << "\" font-size=\"11\" text-anchor=\"middle\" transform=\"rotate(-90 12 " << h / 2
    << ")\">err(prod) = max |prod - ref|</text>"
    << "<text x=\"" << w - m << "\" y=\"" << m - 8
    << "\" font-size=\"10\" text-anchor=\"end\">"
       "<tspan fill=\"#4a4\">- - y = x</tspan>  <tspan fill=\"#c44\">··· y = 2x (ratio "
       "limit)</tspan></text></svg>";
  return s.str();
}

// A training case's mean loss per step for prod, base and ref (linear axes), with the
// step where prod's gated loss first left the band marked.
std::string loss_curve_svg(const LossCurve& curve) {
  const size_t n = curve.ref.size();
  if (n == 0) return "";
  const double w = 420, h = 320, m = 46;
  double lo = curve.ref[0], hi = curve.ref[0];
  for (const auto* series : {&curve.prod, &curve.base, &curve.ref}) {
    for (double v : *series) {
      if (!std::isfinite(v)) continue;
      lo = std::min(lo, v);
      hi = std::max(hi, v);
    }
  }
  if (hi <= lo) hi = lo + 1e-12;
  const auto X = [&](double step) {
    return m + (n > 1 ? step / static_cast<double>(n - 1) : 0.5) * (w - 2 * m);
  };
  const auto Y = [&](double v) { return h - m - (v - lo) / (hi - lo) * (h - 2 * m); };
  std::ostringstream s;
  s << "<svg class=\"plot\" width=\"" << w << "\" height=\"" << h << "\" viewBox=\"0 0 " << w << " "
    << h << "\" xmlns=\"http://www.w3.org/2000/svg\" role=\"img\"><title>loss per step</title>"
    << "<rect x=\"" << m << "\" y=\"" << m << "\" width=\"" << w - 2 * m << "\" height=\""
    << h - 2 * m << "\" fill=\"#fafafa\" stroke=\"#999\"/>";
  const std::pair<const std::vector<double>*, const char*> series[] = {
      {&curve.ref, "#222"}, {&curve.base, "#4a4"}, {&curve.prod, "#2a6fdb"}};
  for (const auto& [values, color] : series) {
    s << "<polyline fill=\"none\" stroke=\"" << color << "\" stroke-width=\"1.5\" points=\"";
    for (size_t i = 0; i < values->size(); ++i) {
      if (std::isfinite((*values)[i]))
        s << X(static_cast<double>(i)) << "," << Y((*values)[i]) << " ";
    }
    s << "\"/>";
  }
  if (curve.divergence_step) {
    const double x = X(static_cast<double>(*curve.divergence_step));
    s << "<line x1=\"" << x << "\" y1=\"" << m << "\" x2=\"" << x << "\" y2=\"" << h - m
      << "\" stroke=\"#d22\" stroke-dasharray=\"3 2\"><title>prod leaves the band at step "
      << *curve.divergence_step << "</title></line>";
  }
  s << "<text x=\"" << m - 4 << "\" y=\"" << Y(hi) + 3 << "\" font-size=\"10\" text-anchor=\"end\">"
    << format_number(hi) << "</text><text x=\"" << m - 4 << "\" y=\"" << Y(lo) + 3
    << "\" font-size=\"10\" text-anchor=\"end\">" << format_number(lo) << "</text>"
    << "<text x=\"" << w / 2 << "\" y=\"" << h - 8
    << "\" font-size=\"11\" text-anchor=\"middle\">step (0 .. " << n - 1 << ")</text>"
    << "<text x=\"" << w - m << "\" y=\"" << m - 8 << "\" font-size=\"10\" text-anchor=\"end\">"
    << "<tspan fill=\"#2a6fdb\">prod</tspan>  <tspan fill=\"#4a4\">base</tspan>  "
       "<tspan fill=\"#222\">ref</tspan> (mean loss)</text></svg>";
  return s.str();
}

// The distribution of |prod - ref| over every element of the case's ratio checks.
std::string histogram_svg(const std::vector<const Check*>& checks) {
  std::vector<int64_t> counts(kErrorBins, 0);
  for (const auto* c : checks) {
    for (size_t i = 0; i < c->error_histogram.size() && i < counts.size(); ++i)
      counts[i] += c->error_histogram[i];
  }
  const int64_t peak = *std::max_element(counts.begin(), counts.end());
  if (peak == 0) return "";
  const double w = 420, h = 320, m = 46, bw = (w - 2 * m) / kErrorBins;
  std::ostringstream s;
  s << "<svg class=\"plot\" width=\"" << w << "\" height=\"" << h << "\" viewBox=\"0 0 " << w << " "
    << h
    << "\" xmlns=\"http://www.w3.org/2000/svg\" role=\"img\"><title>histogram of |prod - "
       "ref|</title>"
    << "<rect x=\"" << m << "\" y=\"" << m << "\" width=\"" << w - 2 * m << "\" height=\""
    << h - 2 * m << "\" fill=\"#fafafa\" stroke=\"#999\"/>";
  for (int i = 0; i < kErrorBins; ++i) {
    const double bh =
        counts[i] == 0 ? 0 : (h - 2 * m) * std::log10(1.0 + counts[i]) / std::log10(1.0 + peak);
    s << "<rect x=\"" << m + i * bw + 1 << "\" y=\"" << h - m - bh << "\" width=\"" << bw - 2
      << "\" height=\"" << bh << "\" fill=\"#2a6fdb\"><title>" << counts[i]
      << " elements with |prod - ref| in 1e" << kErrorBinLow + i * kErrorBinStep << " .. 1e"
      << kErrorBinLow + (i + 1) * kErrorBinStep << "</title></rect>";
    if (i % 4 == 0) {
      s << "<text x=\"" << m + i * bw << "\" y=\"" << h - m + 16
        << "\" font-size=\"10\" text-anchor=\"middle\">1e" << kErrorBinLow + i * kErrorBinStep
        << "</text>";
    }
  }
  s << "<text x=\"" << w / 2 << "\" y=\"" << h - 8
    << "\" font-size=\"11\" text-anchor=\"middle\">|prod - ref| per element (log scale; bar height "
       "log count)</text></svg>";
  return s.str();
}

}  // namespace

std::string to_html(const RunReport& report) {
  std::ostringstream h;
  const auto& env = report.environment;
  h << "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>gradscope "
       "report</title><style>"
       "body{font-family:system-ui,sans-serif;margin:24px;color:#222}table{border-collapse:"
       "collapse;font-size:13px}"
       "td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}td.l,th.l{text-align:left}"
       ".pass{color:#176b1b}.fail{color:#c00;font-weight:bold}.invalid{color:#8a5a00}pre{"
       "background:#fff3f3;padding:8px;"
       "font-size:12px;"
       "white-space:pre-wrap}section{margin:28px "
       "0}.plots{display:flex;gap:16px;flex-wrap:wrap}</style></head><body>\n";
  h << "<h1>gradscope report</h1><p>" << report.passed() << " passed, " << report.failed()
    << " failed &middot; device " << escape_markup(env.device)
    << (env.gpu ? " (" + escape_markup(*env.gpu) + ")" : "") << " &middot; torch "
    << escape_markup(env.torch) << (env.cuda ? " &middot; CUDA " + escape_markup(*env.cuda) : "")
    << " &middot; " << escape_markup(env.compiler) << " &middot; gradscope "
    << escape_markup(report.version) << " (" << escape_markup(env.commit) << ")"
    << " &middot; implementation under test: " << escape_markup(report.implementation.describe())
    << (report.unsupported() > 0
            ? " &middot; " + std::to_string(report.unsupported()) + " unsupported"
            : std::string())
    << "</p>\n";
  h << "<table><tr><th class=\"l\">case</th><th>status</th><th>checks</th><th>failed</th>"
       "<th>max err(prod)/err(base)</th></tr>\n";
  for (const auto& c : report.cases) {
    double worst = 0;
    int64_t failed = 0;
    for (const auto& check : c.checks) {
      failed += check.passed || check.out_of_range ? 0 : 1;
      const auto base = check.gated_baseline_error();
      if (base && *base > 0) worst = std::max(worst, check.gated_error() / *base);
    }
    h << "<tr><td class=\"l\"><a href=\"#" << escape_markup(c.id) << "\">" << escape_markup(c.id)
      << "</a></td><td class=\""
      << (c.passed()           ? "pass\">pass"
          : c.invalid()        ? "invalid\">invalid"
          : c.is_unsupported() ? "l\">unsupported"
                               : "fail\">FAIL")
      << "</td><td>" << c.checks.size() << "</td><td>" << failed << "</td><td>"
      << (worst > 0 ? format_number(worst) : "&ndash;") << "</td></tr>\n";
  }
  h << "</table>\n";
  for (const auto& c : report.cases) {
    std::vector<const Check*> ratio_checks;
    for (const auto& check : c.checks) {
      if (check.baseline_max_abs) ratio_checks.push_back(&check);
    }
    h << "<section id=\"" << escape_markup(c.id) << "\"><h2 class=\""
      << (c.passed()    ? "pass"
          : c.invalid() ? "invalid"
                        : "fail")
      << "\">" << escape_markup(c.id)
      << "</h2>\n<table><tr><th class=\"l\">tensor</th><th>err(prod)</th><th>err(base)</th>"
      << "<th>ratio</th><th>limit</th><th>mean abs</th><th>rel. "
         "Frobenius</th><th>cosine</th><th>status</th></tr>\n";
    for (const auto& check : c.checks) {
      const std::string name =
          check.path.rfind(c.id + "/", 0) == 0 ? check.path.substr(c.id.size() + 1) : check.path;
      const auto base = check.gated_baseline_error();
      h << "<tr><td class=\"l\">" << escape_markup(name) << "</td><td>"
        << format_number(check.gated_error()) << "</td><td>"
        << (base ? format_number(*base) : "exact") << "</td><td>"
        << (base && *base > 0 ? format_number(check.gated_error() / *base) : "&ndash;")
        << "</td><td>" << format_number(check.limit) << "</td><td>" << format_number(check.mean_abs)
        << "</td><td>" << (check.rel_fro ? format_number(*check.rel_fro) : "&ndash;") << "</td><td>"
        << (check.cosine ? cosine_text(*check.cosine) : "&ndash;") << "</td><td class=\""
        << (check.passed         ? "pass\">pass"
            : check.out_of_range ? "invalid\">not judged"
                                 : "fail\">FAIL")
        << "</td></tr>\n";
    }
    h << "</table>\n";
    for (const auto& check : c.checks) {
      if (!check.passed)
        h << "<pre>" << escape_markup(check.failure) << "\nreplay: " << escape_markup(c.replay)
          << "</pre>\n";
    }
    if (!ratio_checks.empty()) {
      h << "<div class=\"plots\">" << scatter_svg(ratio_checks) << histogram_svg(ratio_checks)
        << (c.loss_curve ? loss_curve_svg(*c.loss_curve) : std::string()) << "</div>\n";
    }
    if (!c.metrics.empty()) {
      h << "<p>";
      for (const auto& [name, value] : c.metrics)
        h << escape_markup(name) << " " << format_number(value) << " &middot; ";
      h << "</p>\n";
    }
    h << "</section>\n";
  }
  h << "</body></html>\n";
  return h.str();
}

}  // namespace gradscope::report

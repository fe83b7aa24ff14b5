#include "harness/cli/sample_command.h"

#include <cmath>
#include <cstdio>
#include <iostream>
#include <map>
#include <optional>
#include <set>

#include "harness/catalog/kind_registry.h"
#include "harness/cli/output_paths.h"
#include "harness/common/file_system.h"
#include "harness/common/input_error.h"
#include "harness/distributed/process_ranks.h"
#include "reports/output_file.h"

namespace gradscope {
namespace {

std::string format_figure(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g", v);
  return buf;
}

}  // namespace

// `gradscope sample`: draws valid cases over the whole case space and runs them on correct
// kernels. A failing check there is a false alarm (exit 1). Cases the formats cannot hold are
// counted as invalid: legitimate outcomes of a draw, listed for review, not false alarms.
int command_sample(const SampleCommand& cmd, const ReportOptions& o, const std::string& program) {
  if (process_launch_from_environment()) {
    throw InputError(
        "sample: runs in one process; under torchrun, spread its cases with "
        "`sample --cases-out DIR` first, then `run DIR/*.toml`");
  }
  check_outputs({{"--json", o.json}, {"--junit", o.junit}, {"--cases-out", cmd.cases_out}}, {});
  if (!cmd.cases_out.empty() && files::exists(cmd.cases_out)) {
    throw InputError("--cases-out " + cmd.cases_out + ": exists; give a new folder");
  }
  auto draw = draw_cases(cmd.draw);
  if (!cmd.cases_out.empty()) {
    // Every case file is written before any case runs, into a folder that appears whole (a
    // full disk leaves no folder of some of the cases).
    files::StagedFolder staged(cmd.cases_out);
    for (size_t i = 0; i < draw.cases.size(); ++i) {
      char name[32];
      std::snprintf(name, sizeof name, "/case-%05zu.toml", i);
      report::write_output_file(staged.path() + name, draw.cases[i].toml);
      draw.cases[i].spec.file = cmd.cases_out + name;
    }
    staged.commit();
    if (cmd.draw_only) {
      std::cout << "wrote " << draw.cases.size() << " cases to " << cmd.cases_out << " (seed "
                << cmd.draw.seed << ")\n";
      return 0;
    }
  }
  std::vector<SelectedCase> selected;
  std::set<std::string> seen;
  for (size_t i = 0; i < draw.cases.size(); ++i) {
    auto& c = draw.cases[i];
    std::string id = find_kind(c.spec.kind)->case_id(c.spec);
    if (!seen.insert(id).second) continue;  // two draws of one configuration run once
    SelectedCase sc{std::move(c.spec), std::move(id), "", ""};
    if (cmd.cases_out.empty()) {
      // A prefix of a draw is the shorter draw: drawing i + 1 cases writes this one again,
      // into a fresh folder, so the line replays as often as it is run.
      char name[32];
      std::snprintf(name, sizeof name, "/case-%05zu.toml", i);
      sc.replay_setup = "d=$(mktemp -d) && " + program + " sample --seed " +
                        std::to_string(cmd.draw.seed) + " --count " + std::to_string(i + 1) +
                        " --device " + cmd.draw.device;
      std::string kinds;
      for (const auto& k : cmd.draw.kinds) kinds += (kinds.empty() ? "" : ",") + k;
      if (!kinds.empty()) sc.replay_setup += " --kinds " + kinds;
      sc.replay_setup += " --draw-only --cases-out \"$d/cases\" > /dev/null";
      sc.replay_file = "$d/cases" + std::string(name);
    }
    selected.push_back(std::move(sc));
  }
  std::cout << "sampled " << selected.size() << " cases (seed " << cmd.draw.seed << ", "
            << draw.rejected << " draws refused by the case rules and drawn again)\n";
  const auto report = run_selected(selected, o, program, cmd.max_seconds);
  // How close correct kernels come to their limits: the largest share of the limit and of the
  // floor used, over every ratio check run (the floor's share is informative: sharded sums and
  // other op orders round more than the floor's model and are covered by the base term).
  struct Largest {
    double value = 0;
    std::string path;
  } floor_use, to_limit;
  std::map<std::string, int64_t> by_kind;
  for (const auto& c : report.cases) {
    by_kind[c.kind] += 1;
    for (const auto& check : c.checks) {
      const auto keep = [&](Largest& l, const std::optional<double>& v) {
        if (v && std::isfinite(*v) && *v > l.value) l = {*v, check.path};
      };
      keep(floor_use, check.floor_use);
      keep(to_limit, check.error_to_limit);
    }
  }
  std::cout << "\nsample summary: " << report.cases.size() << " cases run (";
  for (const auto& [kind, n] : by_kind)
    std::cout << (&kind == &by_kind.begin()->first ? "" : ", ") << kind << " " << n;
  std::cout << "): " << report.passed() << " passed, " << report.failed() << " false alarms, "
            << report.invalid() << " out of range or refused\n"
            << "  largest err/limit of prod   " << format_figure(to_limit.value) << "  "
            << to_limit.path << "\n"
            << "  largest floor use of prod   " << format_figure(floor_use.value) << "  "
            << floor_use.path << "\n";
  for (const auto& c : report.cases) {
    if (c.invalid()) std::cout << "  invalid: " << c.input_error << "\n";
  }
  return report.failed() == 0 ? 0 : 1;
}

}  // namespace gradscope

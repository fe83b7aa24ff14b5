// `gradscope run`: runs the selected cases (in this process, or spread over torchrun's
// processes), prints them, writes the reports and turns the report into the exit code.
#pragma once

#include <functional>
#include <string>

#include "harness/cli/case_selection.h"
#include "harness/impl/impl_ops.h"
#include "reports/report_types.h"

namespace gradscope {

class ProcessRanks;

// What a run writes and how it reports (the flags of `run` and `sample` beside the selection).
struct ReportOptions {
  std::string json, dump, junit, html, against, inject;
  impl::ImplChoice impl;  // --impl, --ops-library
  double against_factor = 1.25;
  bool dump_failing_only = false, dump_gradients_only = false, quiet = false, fail_fast = false;
  bool allow_unsupported = false;  // a run that judged nothing exits 0 instead of 2
  bool floor_on_host = false;      // the floor's products of squares stay off the GPU
  bool console = true;             // print each case and the summary (a host program may not)
  std::function<void()> poll;      // between cases and phases: RunOptions::poll
  int dist_timeout = 300;          // seconds: under torchrun, the longest wait for another rank
};

// Why a program without fault switches refuses --inject and `faults` (docs/faults.md).
extern const char* const kNoSwitchesWhy;

// Runs the selected cases, prints each and the summary, writes the reports. `max_seconds`
// > 0 stops before a case once the run has taken that long. Under torchrun (`ranks`) rank 0
// gathers the results, prints them and writes the reports (the other ranks return an empty
// report); docs/distributed.md.
report::RunReport run_selected(std::vector<SelectedCase> selected, const ReportOptions& o,
                               const std::string& program, double max_seconds = 0,
                               ProcessRanks* ranks = nullptr);

// The run's exit code from its report: 2 when a case could not be judged or nothing was, 1 on a
// failing check or a regression against --against, else 0; `message` says why nothing was
// judged where that decided it. exit_code prints the message to stderr.
struct RunVerdict {
  int exit_code = 0;
  std::string message;
};
RunVerdict run_verdict(const report::RunReport& report, const ReportOptions& o);
int exit_code(const report::RunReport& report, const ReportOptions& o);

// For a program that hosts the engine (the Python package): built case specs as selected cases
// (ids from their kinds, each id once), and a run of them with `gradscope run`'s checks of the
// outputs and reports, printing nothing unless o.console.
std::vector<SelectedCase> selected_from_specs(std::vector<CaseSpec> specs);
report::RunReport run_cases(std::vector<SelectedCase> cases, const ReportOptions& o,
                            const std::string& program);

// `gradscope run`, under torchrun when the launch's variables are set.
int command_run(const CaseSelection& sel, const ReportOptions& o, const std::string& program);

}  // namespace gradscope

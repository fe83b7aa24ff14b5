#include "harness/cli/run_command.h"

#include <ATen/ATen.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <iostream>
#include <optional>
#include <set>

#include "gradscope/dequant.h"
#include "gradscope/faults.h"
#include "harness/catalog/kind_registry.h"
#include "harness/cli/environment.h"
#include "harness/cli/output_paths.h"
#include "harness/cli/run_case.h"
#include "harness/common/file_system.h"
#include "harness/common/input_error.h"
#include "harness/distributed/process_ranks.h"
#include "harness/verdict/regression_gate.h"
#include "reports/case_wire.h"
#include "reports/console_report.h"
#include "reports/hdf5_dump.h"
#include "reports/html_report.h"
#include "reports/json_report.h"
#include "reports/junit_report.h"
#include "reports/output_file.h"

#ifndef GRADSCOPE_VERSION
#define GRADSCOPE_VERSION "0.0.0"
#endif

namespace gradscope {

// Where the switches are: the CLI and the tests link them; the Python package and the ops
// library never do (docs/faults.md).
const char* const kNoSwitchesWhy =
    "the gradscope program links them when configured with -DGRADSCOPE_WITH_FAULTS=ON; the "
    "Python package and the ops library never carry them; docs/faults.md";

namespace {

void check_run_outputs(const ReportOptions& o, const std::vector<std::string>& case_files,
                       const std::string& checkpoint_dir) {
  std::vector<NamedPath> inputs = {{"--against", o.against}};
  for (const auto& f : case_files) inputs.push_back({"a case file", f});
  check_outputs({{"--json", o.json}, {"--dump", o.dump}, {"--junit", o.junit}, {"--html", o.html}},
                inputs, checkpoint_dir);
  if (!o.against.empty() && !files::is_regular_file(o.against)) {
    throw InputError("--against " + o.against + ": " +
                     (files::is_directory(o.against) ? "is a folder, not a JSON report"
                      : files::exists(o.against)
                          ? "not a regular file (a FIFO, a device or a socket)"
                          : "file not found"));
  }
  if (!(o.against_factor >= 1.0)) {
    throw InputError("--against-factor must be at least 1, got " +
                     std::to_string(o.against_factor));
  }
  if (!o.inject.empty() && !fault_switches_linked()) {
    throw InputError("--inject " + o.inject + ": this program has no fault switches (" +
                     std::string(kNoSwitchesWhy) + ")");
  }
  if (!o.inject.empty() && !find_fault(o.inject)) {
    throw InputError("--inject " + o.inject + ": no such fault (gradscope faults lists them)");
  }
}

// Under torchrun: which of the selected cases this launch runs, and the rank that runs each
// (-1: every rank together). Cases of a kind that needs as many processes as the launch has
// (fsdp: its world_size) run on every rank; those needing another count are skipped and
// listed; every other case runs on one rank, in turn.
std::vector<int> assign_ranks(std::vector<SelectedCase>& selected, const ProcessRanks& ranks) {
  std::vector<SelectedCase> kept;
  std::string skipped;
  int64_t skipped_count = 0;
  for (auto& sc : selected) {
    const int64_t needed = find_kind(sc.spec.kind)->processes_needed(sc.spec);
    if (needed > 0 && needed != ranks.world_size()) {
      skipped += "\n  " + sc.id + " (world_size " + std::to_string(needed) + ")";
      ++skipped_count;
    } else {
      kept.push_back(std::move(sc));
    }
  }
  if (kept.empty()) {
    throw InputError("no selected case runs with WORLD_SIZE=" + std::to_string(ranks.world_size()) +
                     ": " + std::to_string(skipped_count) +
                     " fsdp cases need as many processes as their world_size" + skipped);
  }
  if (ranks.rank() == 0 && skipped_count > 0) {  // torchrun runs the command line only
    std::cout << "skipped " << skipped_count << " fsdp cases whose world_size is not "
              << ranks.world_size() << " (WORLD_SIZE):" << skipped << "\n";
  }
  selected = std::move(kept);
  std::vector<int> owner(selected.size(), -1);
  int next = 0;
  for (size_t i = 0; i < selected.size(); ++i) {
    if (find_kind(selected[i].spec.kind)->processes_needed(selected[i].spec) == 0) {
      owner[i] = next++ % ranks.world_size();
    }
  }
  return owner;
}

// Before any case runs: the device usable, and the implementation under test's libraries
// loaded with every operator the selected kinds call present under the contract's schema.
// Returns whether a case runs on CUDA.
bool prepare_run(const std::vector<SelectedCase>& selected, const ReportOptions& o,
                 const ProcessRanks* ranks) {
  bool any_cuda = false;
  for (const auto& sc : selected) any_cuda = any_cuda || sc.spec.get_string("device") == "cuda";
  if (any_cuda && !cuda_usable()) {
    throw InputError(std::string("device 'cuda' requested but ") +
                     (built_with_cuda()
                          ? "no CUDA GPU is visible to torch"
                          : "this build has no CUDA kernels (GRADSCOPE_WITH_CUDA=OFF)"));
  }
  // Spread over processes, each runs its cases on its own GPU.
  if (any_cuda && ranks) use_gpu_of_local_rank(ranks->local_rank());
  // The implementation under test: its libraries loaded, every operator the selected kinds
  // call present with the contract's schema, before any case runs.
  impl::load_libraries(o.impl.libraries);
  std::set<std::string> ops;
  for (const auto& sc : selected) {
    const auto case_ops = find_kind(sc.spec.kind)->prod_ops(sc.spec);
    if (case_ops.empty() && !o.impl.is_default()) {
      throw InputError("--impl " + o.impl.ns + ": kind '" + sc.spec.kind +
                       "' runs gradscope's own kernels only (its ranks shard gradscope's "
                       "storage); select other kinds with --filter or case files");
    }
    ops.insert(case_ops.begin(), case_ops.end());
  }
  impl::require_ops(o.impl, {ops.begin(), ops.end()});
  return any_cuda;
}

// Under torchrun: each rank's cases travel to rank 0, in the order they ran (rank 0 knows which
// they were), and rank 0 prints them all in selection order.
void gather_at_rank_zero(const std::vector<SelectedCase>& selected, const std::vector<int>& owner,
                         std::vector<std::optional<report::CaseResult>>& results,
                         ProcessRanks& ranks, const report::ConsoleOptions& console,
                         report::RunReport& report) {
  std::vector<report::CaseResult> mine;
  for (size_t i = 0; i < selected.size(); ++i) {
    if (results[i] && owner[i] == ranks.rank() && ranks.rank() != 0) {
      mine.push_back(std::move(*results[i]));
    }
  }
  ranks.publish("results", report::cases_to_wire(mine));
  if (ranks.rank() != 0) return;
  const auto wires = ranks.collect("results");
  for (int r = 1; r < ranks.world_size(); ++r) {
    auto theirs = report::cases_from_wire(wires[r]);
    size_t next = 0;
    for (size_t i = 0; i < selected.size() && next < theirs.size(); ++i) {
      if (owner[i] == r) results[i] = std::move(theirs[next++]);
    }
  }
  for (auto& r : results) {
    report.cases.push_back(std::move(*r));
    report::print_case(std::cout, report.cases.back(), console);
  }
  std::cout << "ran on " << ranks.world_size() << " processes (torchrun)\n";
}

// The report files the run asked for; the dump is finished here, its cases written as they ran.
void write_reports(const report::RunReport& report, const ReportOptions& o,
                   std::optional<report::DumpWriter>& dump) {
  if (!o.json.empty()) {
    report::write_output_file(o.json, report::to_json(report).dump(2) + "\n");
  }
  if (dump) dump->finish(report);
  if (!o.junit.empty()) report::write_output_file(o.junit, report::to_junit_xml(report));
  if (!o.html.empty()) report::write_output_file(o.html, report::to_html(report));
}

}  // namespace

report::RunReport run_selected(std::vector<SelectedCase> selected, const ReportOptions& o,
                               const std::string& program, double max_seconds,
                               ProcessRanks* ranks) {
  // The rank that runs case i; -1: every rank (and every case without torchrun).
  std::vector<int> owner =
      ranks ? assign_ranks(selected, *ranks) : std::vector<int>(selected.size(), -1);
  const bool reports_here = !ranks || ranks->rank() == 0;
  const FaultInfo* fault = o.inject.empty() ? nullptr : find_fault(o.inject);
  const bool any_cuda = prepare_run(selected, o, ranks);
  // Repeatable CUDA runs: the same case twice gives the same JSON checks and dumps.
  std::optional<CudaDeterminism> determinism;
  if (any_cuda) determinism.emplace(/*strict=*/o.impl.is_builtin());
  report::RunReport report;
  report.version = GRADSCOPE_VERSION;
  report.environment = probe_environment(any_cuda ? "cuda" : "cpu");
  report.implementation = {o.impl.ns, kOpSchemaVersion, o.impl.libraries};
  const report::ConsoleOptions console{o.quiet};
  RunOptions options;
  options.keep_tensors = !o.dump.empty();
  options.floor_on_host = o.floor_on_host;
  options.impl = o.impl.ns;
  options.ops_libraries = o.impl.libraries;
  options.imports = o.impl.imports;
  options.ranks = ranks;
  options.poll = o.poll;
  // The dump is written case by case, each case's tensors dropped once they are in the file.
  std::optional<report::DumpWriter> dump;
  if (!o.dump.empty())
    dump.emplace(o.dump, report::DumpOptions{o.dump_failing_only, o.dump_gradients_only});
  // The production code runs as the faulty variant for this run only.
  std::optional<ScopedFault> injected;
  if (fault) injected.emplace(fault->fault);
  if (fault && reports_here && o.console) {
    std::cout << "injected fault: " << fault->name << " (" << fault->breaks << ")\n";
  }
  // A progress line on long runs, only where a person watches (stderr is a terminal).
  const bool progress = o.console && !o.quiet && !ranks && ::isatty(STDERR_FILENO);
  // Under torchrun the cases print once rank 0 has them all, in order.
  std::vector<std::optional<report::CaseResult>> results(selected.size());
  const auto start = std::chrono::steady_clock::now();
  const auto elapsed = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  for (size_t i = 0; i < selected.size(); ++i) {
    if (max_seconds > 0 && elapsed() > max_seconds) {
      if (o.console)
        std::cout << "--max-seconds " << max_seconds << ": stopped after " << i << " of "
                  << selected.size() << " cases\n";
      break;
    }
    if (ranks && owner[i] >= 0 && owner[i] != ranks->rank()) continue;
    if (o.poll) o.poll();
    if (progress) {
      std::fprintf(stderr, "\r[%zu/%zu] %.0fs %s\x1b[K", i + 1, selected.size(), elapsed(),
                   selected[i].id.c_str());
    }
    options.case_key = "case" + std::to_string(i);
    if (ranks) {
      auto done = run_case(selected[i], program, options);
      if (reports_here || owner[i] >= 0) results[i] = std::move(done);
      continue;
    }
    report.cases.push_back(run_case(selected[i], program, options));
    if (dump) {
      auto& done = report.cases.back();
      dump->add_case(done);
      done.inputs.clear();
      for (auto& check : done.checks) check.tensors.reset();
    }
    if (progress) std::fprintf(stderr, "\r\x1b[K");
    if (o.console) {
      report::print_case(std::cout, report.cases.back(), console);
      std::cout.flush();  // a run stopped by a time bound keeps every finished case's lines
    }
    // A failure stops the run; a case not judged or declined does not (it is no verdict).
    const std::string status = report.cases.back().status();
    if (o.fail_fast && status == "fail" && i + 1 < selected.size()) {
      if (o.console)
        std::cout << "--fail-fast: stopped at the first failing case; " << selected.size() - i - 1
                  << " of " << selected.size() << " cases not run\n";
      break;
    }
  }
  if (ranks) {
    gather_at_rank_zero(selected, owner, results, *ranks, console, report);
    if (!reports_here) return report;
  }
  if (o.console) report::print_summary(std::cout, report);
  write_reports(report, o, dump);
  return report;
}

RunVerdict run_verdict(const report::RunReport& report, const ReportOptions& o) {
  const int64_t regressions =
      o.against.empty() ? 0 : compare_with_accepted(std::cout, report, o.against, o.against_factor);
  // A verdict on prod (a failure, a regression) outranks a case the run could not judge
  // (docs/cli.md, exit codes).
  if (report.failed() > 0 || regressions > 0) return {1, ""};
  if (report.invalid() > 0) return {2, ""};  // a case the run could not judge: an input problem
  // Every case declined by the implementation under test: a gate that goes green having
  // compared nothing proves nothing.
  if (!report.cases.empty() && report.passed() == 0 && report.failed() == 0 &&
      !o.allow_unsupported) {
    return {2, "no case was judged: " + std::to_string(report.unsupported()) + " unsupported (" +
                   report.implementation.ns + " declined all " +
                   std::to_string(report.cases.size()) +
                   " selected cases); select cases it implements, or pass --allow-unsupported"};
  }
  return {0, ""};
}

int exit_code(const report::RunReport& report, const ReportOptions& o) {
  const auto verdict = run_verdict(report, o);
  if (!verdict.message.empty()) std::cerr << "gradscope: error: " << verdict.message << "\n";
  return verdict.exit_code;
}

std::vector<SelectedCase> selected_from_specs(std::vector<CaseSpec> specs) {
  std::vector<SelectedCase> selected;
  std::set<std::string> seen;
  for (auto& spec : specs) {
    std::string id = find_kind(spec.kind)->case_id(spec);
    if (seen.insert(id).second) selected.push_back({std::move(spec), std::move(id), "", ""});
  }
  if (selected.empty()) throw InputError("no cases selected");
  return selected;
}

report::RunReport run_cases(std::vector<SelectedCase> cases, const ReportOptions& o,
                            const std::string& program) {
  // Outputs may not replace a case file the cases came from (built cases name no file).
  std::vector<std::string> case_files;
  for (const auto& sc : cases) {
    if (files::is_regular_file(sc.spec.file)) case_files.push_back(sc.spec.file);
  }
  check_run_outputs(o, case_files, "");
  return run_selected(std::move(cases), o, program);
}

int command_run(const CaseSelection& sel, const ReportOptions& o, const std::string& program) {
  check_run_outputs(o, sel.files, sel.checkpoint.dir);
  const auto launch = process_launch_from_environment();
  if (!launch) return exit_code(run_selected(select_cases(sel), o, program), o);
  if (!o.dump.empty()) {
    throw InputError("--dump " + o.dump +
                     ": not under torchrun (the tensors would travel through the ranks' store); "
                     "dump from a plain run of the case");
  }
  if (o.fail_fast) {
    throw InputError(
        "--fail-fast: not under torchrun (each rank runs other cases, and a rank "
        "that stops would leave the others waiting in the fsdp cases)");
  }
  auto cases = select_cases(sel);
  ProcessRanks ranks(*launch, std::chrono::seconds(o.dist_timeout));
  // Every rank leaves with rank 0's exit code, and rank 0 only once each has read it: rank 0
  // may be the store's server.
  try {
    const auto report = run_selected(std::move(cases), o, program, 0, &ranks);
    if (ranks.rank() != 0) {
      const int code = std::stoi(ranks.collect("exit_code", {0})[0]);
      ranks.publish("exit_read", "");
      return code;
    }
    const int code = exit_code(report, o);
    // Everything rank 0 prints is out before the others learn the code: once one of them exits
    // non-zero, torchrun stops rank 0 with SIGTERM, and a pipe's buffered lines would be lost.
    std::cout.flush();
    std::fflush(stdout);
    ranks.publish("exit_code", std::to_string(code));
    std::vector<int> others;
    for (int r = 1; r < ranks.world_size(); ++r) others.push_back(r);
    if (!others.empty()) ranks.collect("exit_read", others);
    return code;
  } catch (const RankFailure& e) {
    ranks.fail(e.what());
    throw;
  } catch (const std::exception& e) {
    ranks.fail(std::string("rank ") + std::to_string(ranks.rank()) + ": " + e.what());
    throw;
  }
}

}  // namespace gradscope

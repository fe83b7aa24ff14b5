#include "harness/cli/cli.h"
#include "harness/common/cli_parse.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <fnmatch.h>
#include <sys/stat.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <map>
#include <optional>
#include <set>

#include "gradscope/dequant.h"
#include "gradscope/faults.h"
#include "harness/catalog/case_coverage.h"
#include "harness/catalog/case_file.h"
#include "harness/catalog/case_sampler.h"
#include "harness/catalog/kind_registry.h"
#include "harness/checkpoint/checkpoint_writer.h"
#include "harness/checkpoint/gptq_config.h"
#include "harness/cli/checkpoint_commands.h"
#include "harness/cli/environment.h"
#include "harness/common/file_system.h"
#include "harness/common/host_memory.h"
#include "harness/common/input_error.h"
#include "harness/distributed/process_ranks.h"
#include "harness/impl/impl_ops.h"
#include "harness/engine/case_kind.h"
#include "harness/spec/case_spec.h"
#include "harness/verdict/regression_gate.h"
#include "reports/case_wire.h"
#include "reports/console_report.h"
#include "reports/dump_tools.h"
#include "reports/hdf5_dump.h"
#include "reports/html_report.h"
#include "reports/json_report.h"
#include "reports/junit_report.h"
#include "reports/output_file.h"

#ifndef GRADSCOPE_DEFAULT_CASES_DIR
#define GRADSCOPE_DEFAULT_CASES_DIR "cases"
#endif
#ifndef GRADSCOPE_VERSION
#define GRADSCOPE_VERSION "0.0.0"
#endif

namespace gradscope {
namespace {

struct Selection {
  std::vector<std::string> files;
  std::string suite;
  std::string filter;
  std::string cases_dir;
  std::string device, dtype;
  int64_t seed = -1;
  CheckpointSelection checkpoint;
};

std::string cases_dir(const Selection& sel) {
  if (!sel.cases_dir.empty()) return sel.cases_dir;
  if (const char* env = std::getenv("GRADSCOPE_CASES_DIR")) return env;
  return GRADSCOPE_DEFAULT_CASES_DIR;
}

std::vector<std::string> suite_files(const std::string& dir, const std::string& suite) {
  const std::string folder = dir + "/" + suite;
  if (suite.empty() || suite.find("..") != std::string::npos || !files::is_directory(folder)) {
    std::string available;
    for (const auto& n : files::subdirectories(dir))
      available += (available.empty() ? "" : ", ") + n;
    throw InputError("unknown suite '" + suite + "' (no folder " + folder +
                     "); available suites: " + (available.empty() ? "none" : available));
  }
  auto found = files::find_files(folder, ".toml");
  if (found.empty()) {
    throw InputError("suite '" + suite + "' (" + folder + ") holds no .toml case files");
  }
  return found;
}

struct SelectedCase {
  CaseSpec spec;
  std::string id;
};

// The cases one command may select (each file holds at most 100000): the specs are kept in
// memory, and a run of more would not finish anyway.
constexpr size_t kMaxCasesPerRun = 1000000;
// Where the switches are: the CLI and the tests link them; the Python package and the ops
// library never do (docs/faults.md).
constexpr const char* kNoSwitchesWhy =
    "the gradscope program links them when configured with -DGRADSCOPE_WITH_FAULTS=ON; the "
    "Python package and the ops library never carry them; docs/faults.md";

std::vector<SelectedCase> select_cases(const Selection& sel) {
  std::vector<std::string> files = sel.files;
  std::vector<CaseSpec> specs;
  if (!sel.checkpoint.dir.empty()) {
    if (!files.empty() || !sel.suite.empty()) {
      throw InputError("--checkpoint selects its own cases: give no case files or --suite");
    }
    specs = checkpoint_cases(sel.checkpoint);
  } else if (!sel.suite.empty() || files.empty()) {
    const auto more = suite_files(cases_dir(sel), sel.suite.empty() ? "smoke" : sel.suite);
    files.insert(files.end(), more.begin(), more.end());
  }
  std::vector<SelectedCase> selected;
  std::set<std::string> seen;
  for (const auto& file : files) {
    for (auto& spec : load_case_file(file)) specs.push_back(std::move(spec));
    if (specs.size() > kMaxCasesPerRun) {
      throw InputError(file + ": the selection expands to more than " +
                       std::to_string(kMaxCasesPerRun) + " cases; select fewer files");
    }
  }
  for (auto& spec : specs) {
    if (!sel.device.empty()) override_field(spec, "device", sel.device, "--device");
    if (!sel.dtype.empty()) override_field(spec, "dtype", sel.dtype, "--dtype");
    if (sel.seed >= 0) override_field(spec, "seed", std::to_string(sel.seed), "--seed");
    std::string id = find_kind(spec.kind)->case_id(spec);
    if (!sel.filter.empty() && fnmatch(sel.filter.c_str(), id.c_str(), 0) != 0) continue;
    if (!seen.insert(id).second) continue;  // an override can make two cases identical
    selected.push_back({std::move(spec), std::move(id)});
  }
  if (selected.empty()) {
    throw InputError(sel.filter.empty() ? "no cases selected"
                                        : "no case id matches --filter '" + sel.filter + "'");
  }
  return selected;
}

std::string format_figure(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g", v);
  return buf;
}

std::string shell_quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

report::CaseResult run_case(const SelectedCase& sc, const std::string& program,
                            const RunOptions& options) {
  report::CaseResult result;
  result.id = sc.id;
  result.kind = sc.spec.kind;
  result.source = sc.spec.file;
  result.spec = sc.spec.fields();
  result.spec_toml = sc.spec.to_toml();
  const std::string checkpoint = sc.spec.kind == "dequant" ? "" : sc.spec.get_string("checkpoint");
  const std::string source = checkpoint.empty() || checkpoint != sc.spec.file
                                 ? shell_quote(sc.spec.file)
                                 : "--checkpoint " + shell_quote(checkpoint) + " --layers " +
                                       std::to_string(sc.spec.get_int("layer"));
  result.replay = program + " run " + source + " --filter " + shell_quote(sc.id) + " --device " +
                  sc.spec.get_string("device") + " --dtype " + sc.spec.get_string("dtype") +
                  " --seed " + std::to_string(sc.spec.get_int("seed"));
  const auto start = std::chrono::steady_clock::now();
  // Refused before anything is allocated: a case that cannot fit would be killed by the
  // kernel's out-of-memory handler part way, not fail with a message.
  const double at_least = find_kind(sc.spec.kind)->host_bytes_at_least(sc.spec);
  const double memory = host_memory_bytes();
  if (memory > 0 && at_least > memory) {
    result.input_error = sc.id + ": needs at least " + format_gib(at_least) +
                         " of host memory (the reference's fp64 weights and activations); this "
                         "machine has " +
                         format_gib(memory);
    return result;
  }
  if (options.impl != "gradscope") result.replay += " --impl " + shell_quote(options.impl);
  for (const auto& lib : options.ops_libraries)
    result.replay += " --ops-library " + shell_quote(lib);
  try {
    auto output = find_kind(sc.spec.kind)->run(sc.spec, sc.id, options);
    result.checks = std::move(output.checks);
    result.metrics = std::move(output.metrics);
    result.loss_curve = std::move(output.loss_curve);
    result.inputs = std::move(output.inputs);
    // A result the case's formats cannot hold makes the case invalid, not failed.
    for (const auto& check : result.checks) {
      if (check.out_of_range) {
        result.input_error = check.failure;
        break;
      }
    }
  } catch (const RankFailure&) {
    throw;  // not this case's verdict: the launch is broken, and the run stops
  } catch (const InputError& e) {
    result.input_error = sc.id + ": " + e.what();
  } catch (const impl::Unsupported& e) {
    result.unsupported = e.what();
  } catch (const std::bad_alloc&) {
    result.input_error = sc.id + ": out of memory: the case needs more than this machine has";
  } catch (const c10::Error& e) {
    // An allocation that fails is the case's size, not a verdict on prod.
    const std::string what = e.what_without_backtrace();
    if (dynamic_cast<const c10::OutOfMemoryError*>(&e) != nullptr ||
        what.find("can't allocate memory") != std::string::npos) {
      result.input_error = sc.id + ": out of memory: " + what.substr(0, what.find('\n'));
    } else {
      report::Check error;
      error.path = sc.id + "/error";
      const std::string prod = options.impl == "gradscope" ? "prod" : "prod (" + options.impl + ")";
      error.failure = sc.id + ": " + prod + " raised an error: " + what;
      result.checks.push_back(error);
    }
  } catch (const std::exception& e) {
    report::Check error;
    error.path = sc.id + "/error";
    error.failure = sc.id + ": the case raised an error: " + e.what();
    result.checks.push_back(error);
  }
  impl::after_case();
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return result;
}

// A path a command reads or writes, with the flag that named it (for messages).
struct NamedPath {
  std::string flag, path;
};

// The absolute name `path` has once its folder is resolved (symlinks, ".", ".."), so that two
// spellings of one file compare equal; the path itself when its folder does not resolve.
std::string resolved_name(const std::string& path) {
  const auto slash = path.find_last_of('/');
  const std::string folder = slash == std::string::npos ? "."
                             : slash == 0               ? "/"
                                                        : path.substr(0, slash);
  const std::string name = slash == std::string::npos ? path : path.substr(slash + 1);
  char buf[PATH_MAX];
  if (::realpath(folder.c_str(), buf) == nullptr) return path;
  const std::string dir = buf;
  if (name.empty() || name == ".") return dir;
  return (dir == "/" ? "" : dir) + "/" + name;
}

bool same_file(const std::string& a, const std::string& b) {
  struct stat sa {
  }, sb{};
  if (::stat(a.c_str(), &sa) == 0 && ::stat(b.c_str(), &sb) == 0) {
    return sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
  }
  return resolved_name(a) == resolved_name(b);
}

// Every output a command will write, checked before any work: writable (a file in an
// existing folder, or a device or pipe written through: reports/output_file.h), not "-",
// no two outputs on one file, no output on one of the command's inputs, none replacing a
// file of a checkpoint folder it reads.
void check_outputs(const std::vector<NamedPath>& outputs, const std::vector<NamedPath>& inputs,
                   const std::string& checkpoint_dir = "") {
  std::vector<NamedPath> files_so_far;
  for (const auto& out : outputs) {
    if (out.path.empty()) continue;
    if (out.path == "-") {
      throw InputError(out.flag +
                       " -: standard output carries the console report; name a file "
                       "(/dev/stdout writes through)");
    }
    report::OutputTarget target;
    try {
      target = report::output_target(out.path);
    } catch (const report::OutputError& e) {
      throw InputError(out.flag + " " + out.path + ": " + e.what());
    }
    if (target == report::OutputTarget::kStream) continue;  // /dev/null twice is fine
    for (const auto& earlier : files_so_far) {
      if (same_file(earlier.path, out.path)) {
        throw InputError(out.flag + " " + out.path + ": the same file as " + earlier.flag);
      }
    }
    for (const auto& in : inputs) {
      if (!in.path.empty() && same_file(in.path, out.path)) {
        throw InputError(out.flag + " " + out.path + ": is an input of this run (" + in.flag + ")");
      }
    }
    if (!checkpoint_dir.empty()) {
      char buf[PATH_MAX];
      const std::string dir = ::realpath(checkpoint_dir.c_str(), buf) ? buf : checkpoint_dir;
      const std::string resolved = resolved_name(out.path);
      if (resolved.rfind(dir + "/", 0) == 0) {
        const std::string name = resolved.substr(dir.size() + 1);
        if (files::exists(out.path)) {
          throw InputError(out.flag + " " + out.path + ": would replace a file of the checkpoint " +
                           checkpoint_dir + " this command reads");
        }
        if (checkpoint_reads_name(name)) {
          throw InputError(out.flag + " " + out.path + ": the checkpoint reader reads " + name +
                           " in " + checkpoint_dir +
                           "; an output there would be read as part "
                           "of the checkpoint next time");
        }
      }
    }
    files_so_far.push_back(out);
  }
}

struct RunOutputs {
  std::string json, dump, junit, html, against, inject;
  impl::Selection impl;  // --impl, --ops-library
  double against_factor = 1.25;
  bool dump_failing_only = false, dump_gradients_only = false, quiet = false, fail_fast = false;
  bool allow_unsupported = false;  // a run that judged nothing exits 0 instead of 2
  int dist_timeout = 300;          // seconds: under torchrun, the longest wait for another rank
};

void check_run_outputs(const RunOutputs& o, const Selection& sel) {
  std::vector<NamedPath> inputs = {{"--against", o.against}};
  for (const auto& f : sel.files) inputs.push_back({"a case file", f});
  check_outputs({{"--json", o.json}, {"--dump", o.dump}, {"--junit", o.junit}, {"--html", o.html}},
                inputs, sel.checkpoint.dir);
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

// Runs the selected cases, prints each and the summary, writes the reports. `max_seconds`
// > 0 stops before a case once the run has taken that long.
// Under torchrun (`ranks`): fsdp cases whose world_size is the launch's run on every rank
// together, the others are skipped and listed; every other case runs on one rank, in turn;
// rank 0 gathers the results, prints them and writes the reports (the other ranks return an
// empty report). docs/distributed.md.
report::RunReport run_selected(std::vector<SelectedCase> selected, const RunOutputs& o,
                               const std::string& program, double max_seconds = 0,
                               ProcessRanks* ranks = nullptr) {
  std::vector<int> owner(selected.size(), -1);  // the rank that runs case i; -1: every rank
  if (ranks) {
    std::vector<SelectedCase> kept;
    std::string skipped;
    int64_t skipped_count = 0;
    for (auto& sc : selected) {
      const int64_t needed = find_kind(sc.spec.kind)->processes_needed(sc.spec);
      if (needed > 0 && needed != ranks->world_size()) {
        skipped += "\n  " + sc.id + " (world_size " + std::to_string(needed) + ")";
        ++skipped_count;
      } else {
        kept.push_back(std::move(sc));
      }
    }
    if (kept.empty()) {
      throw InputError("no selected case runs with WORLD_SIZE=" +
                       std::to_string(ranks->world_size()) + ": " + std::to_string(skipped_count) +
                       " fsdp cases need as many processes as their world_size" + skipped);
    }
    if (ranks->rank() == 0 && skipped_count > 0) {
      std::cout << "skipped " << skipped_count << " fsdp cases whose world_size is not "
                << ranks->world_size() << " (WORLD_SIZE):" << skipped << "\n";
    }
    selected = std::move(kept);
    owner.assign(selected.size(), -1);
    int next = 0;
    for (size_t i = 0; i < selected.size(); ++i) {
      if (find_kind(selected[i].spec.kind)->processes_needed(selected[i].spec) == 0) {
        owner[i] = next++ % ranks->world_size();
      }
    }
  }
  const bool reports_here = !ranks || ranks->rank() == 0;
  const FaultInfo* fault = o.inject.empty() ? nullptr : find_fault(o.inject);
  bool any_cuda = false;
  for (const auto& sc : selected) any_cuda = any_cuda || sc.spec.get_string("device") == "cuda";
  if (any_cuda && !cuda_usable()) {
    throw InputError(std::string("device 'cuda' requested but ") +
                     (built_with_cuda()
                          ? "no CUDA GPU is visible to torch"
                          : "this build has no CUDA kernels (GRADSCOPE_WITH_CUDA=OFF)"));
  }
  // Repeatable CUDA runs: the same case twice gives the same JSON checks and dumps.
  if (any_cuda) make_cuda_deterministic();
  // Spread over processes, each runs its cases on its own GPU.
  if (any_cuda && ranks) use_gpu_of_local_rank(ranks->local_rank());
  // The implementation under test: its libraries loaded, every operator the selected kinds
  // call present with the contract's schema, before any case runs.
  impl::load_libraries(o.impl.libraries);
  std::set<std::string> kinds, ops;
  for (const auto& sc : selected) kinds.insert(sc.spec.kind);
  for (const auto& kind : kinds) {
    const auto kind_ops = find_kind(kind)->prod_ops();
    if (kind_ops.empty() && !o.impl.is_default()) {
      throw InputError("--impl " + o.impl.ns + ": kind '" + kind +
                       "' runs gradscope's own kernels only (its ranks shard gradscope's "
                       "storage); select other kinds with --filter or case files");
    }
    ops.insert(kind_ops.begin(), kind_ops.end());
  }
  impl::require_ops(o.impl.ns, {ops.begin(), ops.end()});
  report::RunReport report;
  report.version = GRADSCOPE_VERSION;
  report.environment = probe_environment(any_cuda ? "cuda" : "cpu");
  report.implementation = {o.impl.ns, kOpSchemaVersion, o.impl.libraries};
  const report::ConsoleOptions console{o.quiet};
  RunOptions options;
  options.keep_tensors = !o.dump.empty();
  options.impl = o.impl.ns;
  options.ops_libraries = o.impl.libraries;
  options.ranks = ranks;
  // The dump is written case by case, each case's tensors dropped once they are in the file.
  std::optional<report::DumpWriter> dump;
  if (!o.dump.empty())
    dump.emplace(o.dump, report::DumpOptions{o.dump_failing_only, o.dump_gradients_only});
  // The production code runs as the faulty variant for this run only.
  std::optional<ScopedFault> injected;
  if (fault) injected.emplace(fault->fault);
  if (fault && reports_here) {
    std::cout << "injected fault: " << fault->name << " (" << fault->breaks << ")\n";
  }
  // A progress line on long runs, only where a person watches (stderr is a terminal).
  const bool progress = !o.quiet && !ranks && ::isatty(STDERR_FILENO);
  // Under torchrun the cases print once rank 0 has them all, in order.
  std::vector<std::optional<report::CaseResult>> results(selected.size());
  const auto start = std::chrono::steady_clock::now();
  const auto elapsed = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  for (size_t i = 0; i < selected.size(); ++i) {
    if (max_seconds > 0 && elapsed() > max_seconds) {
      std::cout << "--max-seconds " << max_seconds << ": stopped after " << i << " of "
                << selected.size() << " cases\n";
      break;
    }
    if (ranks && owner[i] >= 0 && owner[i] != ranks->rank()) continue;
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
    report::print_case(std::cout, report.cases.back(), console);
    std::cout.flush();  // a run stopped by a time bound keeps every finished case's lines
    if (o.fail_fast && !report.cases.back().passed() && i + 1 < selected.size()) {
      std::cout << "--fail-fast: stopped at the first failing case; " << selected.size() - i - 1
                << " of " << selected.size() << " cases not run\n";
      break;
    }
  }
  if (ranks) {
    // Each rank's cases to rank 0, in the order they ran (rank 0 knows which they were).
    std::vector<report::CaseResult> mine;
    for (size_t i = 0; i < selected.size(); ++i) {
      if (results[i] && owner[i] == ranks->rank() && ranks->rank() != 0) {
        mine.push_back(std::move(*results[i]));
      }
    }
    ranks->publish("results", report::cases_to_wire(mine));
    if (!reports_here) return report;
    const auto wires = ranks->collect("results");
    for (int r = 1; r < ranks->world_size(); ++r) {
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
    std::cout << "ran on " << ranks->world_size() << " processes (torchrun)\n";
  }
  report::print_summary(std::cout, report);
  if (!o.json.empty()) {
    report::write_output_file(o.json, report::to_json(report).dump(2) + "\n");
  }
  if (dump) dump->finish(report);
  if (!o.junit.empty()) report::write_output_file(o.junit, report::to_junit_xml(report));
  if (!o.html.empty()) report::write_output_file(o.html, report::to_html(report));
  return report;
}

// The run's exit code from its report.
int exit_code(const report::RunReport& report, const RunOutputs& o) {
  const int64_t regressions =
      o.against.empty() ? 0 : compare_with_accepted(std::cout, report, o.against, o.against_factor);
  if (report.invalid() > 0) return 2;  // a case the run could not judge: an input problem
  // Every case declined by the implementation under test: a gate that goes green having
  // compared nothing proves nothing.
  if (!report.cases.empty() && report.passed() == 0 && report.failed() == 0 &&
      !o.allow_unsupported) {
    std::cerr << "gradscope: error: no case was judged: " << report.unsupported()
              << " unsupported (" << report.implementation.ns << " declined all "
              << report.cases.size()
              << " selected cases); select cases it implements, or pass --allow-unsupported\n";
    return 2;
  }
  return report.failed() == 0 && regressions == 0 ? 0 : 1;
}

int command_run(const Selection& sel, const RunOutputs& o, const std::string& program) {
  check_run_outputs(o, sel);
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

struct SampleCommand {
  SampleOptions draw;
  std::string cases_out;  // folder for the drawn case files
  double max_seconds = 0;
};

// `gradscope sample`: draws valid cases over the whole case space and runs them on correct
// kernels. A failing check there is a false alarm (exit 1). Cases the formats cannot hold are
// counted as invalid: legitimate outcomes of a draw, listed for review, not false alarms.
int command_sample(const SampleCommand& cmd, const RunOutputs& o, const std::string& program) {
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
  }
  std::vector<SelectedCase> selected;
  std::set<std::string> seen;
  for (auto& c : draw.cases) {
    std::string id = find_kind(c.spec.kind)->case_id(c.spec);
    if (!seen.insert(id).second) continue;  // two draws of one configuration run once
    selected.push_back({std::move(c.spec), std::move(id)});
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

int command_faults() {
  for (const auto& f : fault_catalogue()) {
    std::printf("%-32s %-40s %s; caught at %s\n", f.name, f.where, f.breaks, f.caught_at);
  }
  return 0;
}

int command_show(const std::string& file, const std::string& path) {
  report::show_dump(std::cout, report::read_dump(file), file, path);
  return 0;
}

int command_diff(const std::string& a, const std::string& b, const report::DiffOptions& options,
                 const std::string& json_path) {
  check_outputs({{"--json", json_path}}, {{"the first dump", a}, {"the second dump", b}});
  const auto dump_a = report::read_dump(a);
  const auto dump_b = report::read_dump(b);
  const auto result = report::diff_dumps(std::cout, dump_a, a, dump_b, b, options);
  if (!json_path.empty()) report::write_output_file(json_path, result.json.dump(2) + "\n");
  return result.differing == 0 ? 0 : 1;
}

// Exit 1 when the selection misses a required axis value, residue or pair (docs/coverage.md).
int command_coverage(const Selection& sel, const std::string& json) {
  check_outputs({{"--json", json}}, {});
  std::vector<CaseSpec> specs;
  for (auto& sc : select_cases(sel)) specs.push_back(std::move(sc.spec));
  const auto report = measure_coverage(specs);
  print_coverage(std::cout, report);
  if (!json.empty()) report::write_output_file(json, coverage_json(report).dump(2) + "\n");
  return report.missing() == 0 ? 0 : 1;
}

int command_list(const Selection& sel) {
  for (const auto& sc : select_cases(sel)) std::cout << sc.id << '\n';
  return 0;
}

// A path or name given on the command line must not be empty: `--json ""` would otherwise
// silently write nothing.
const CLI::Validator kNonEmpty(
    [](std::string& value) { return value.empty() ? std::string("must not be empty") : ""; },
    "NONEMPTY");
// A tolerance: a finite number >= 0 (NaN passes CLI11's own range check).
const CLI::Validator kTolerance(
    [](std::string& value) {
      char* end = nullptr;
      const double v = std::strtod(value.c_str(), &end);
      return end != value.c_str() && *end == '\0' && std::isfinite(v) && v >= 0
                 ? std::string()
                 : "must be a finite number >= 0, got " + value;
    },
    "TOLERANCE");

// A seed: a decimal integer in the case files' range. Checked as text, since CLI11 reads "-1"
// into an unsigned seed as 2^64 - 1 and 2^64 as 0.
const CLI::Validator kSeed(
    [](std::string& value) {
      const bool digits = !value.empty() && value.size() <= 16 &&
                          value.find_first_not_of("0123456789") == std::string::npos;
      return digits && std::stoll(value) <= kMaxCaseSeed
                 ? std::string()
                 : "must be an integer in [0, " + std::to_string(kMaxCaseSeed) + "], got " + value;
    },
    "SEED");

void add_selection_options(CLI::App* cmd, Selection& sel) {
  cmd->add_option("cases", sel.files, "case files (TOML)");
  cmd->add_option("--suite", sel.suite, "suite name: the folder cases/NAME (default smoke)")
      ->check(kNonEmpty);
  cmd->add_option("--filter", sel.filter, "only case ids matching this glob")->check(kNonEmpty);
  cmd->add_option(
      "--cases-dir", sel.cases_dir,
      "folder holding the suites (default $GRADSCOPE_CASES_DIR or the source tree's cases/)");
  cmd->add_option("--device", sel.device, "override every case's device")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  cmd->add_option("--dtype", sel.dtype, "override every case's dtype")
      ->check(CLI::IsMember({"fp32", "fp16", "bf16"}));
  cmd->add_option("--seed", sel.seed, "override every case's seed")->check(kSeed);
  auto* checkpoint = cmd->add_option("--checkpoint", sel.checkpoint.dir,
                                     "run the LoRA cases on this GPTQ checkpoint's packed weights")
                         ->check(kNonEmpty);
  // A flag that modifies another is refused without it, rather than ignored.
  cmd->add_option("--layers", sel.checkpoint.layers, "checkpoint layers (default 0), e.g. 0,3")
      ->delimiter(',')
      ->check(CLI::NonNegativeNumber)
      ->needs(checkpoint);
  cmd->add_option("--projections", sel.checkpoint.projections,
                  "checkpoint projections (default all), e.g. q_proj,down_proj")
      ->delimiter(',')
      ->needs(checkpoint);
}

}  // namespace

int run_cli(int argc, const char* const* argv) {
  CLI::App app{"gradscope: proves quantized-LoRA training kernels compute the right gradients"};
  app.require_subcommand(1);
  Selection run_sel, list_sel;
  RunOutputs outputs;
  auto* run = app.add_subcommand("run", "run cases and compare prod against the fp64 reference");
  add_selection_options(run, run_sel);
  run->add_option("--json", outputs.json, "write the JSON report to FILE")->check(kNonEmpty);
  auto* dump = run->add_option("--dump", outputs.dump,
                               "write an HDF5 dump of inputs and compared tensors to FILE")
                   ->check(kNonEmpty);
  run->add_flag("--dump-failing-only", outputs.dump_failing_only, "dump only failing cases")
      ->needs(dump);
  run->add_flag("--dump-gradients-only", outputs.dump_gradients_only,
                "dump only gradient checks, no inputs")
      ->needs(dump);
  run->add_option("--junit", outputs.junit, "write JUnit XML (one testcase per check) to FILE")
      ->check(kNonEmpty);
  run->add_option("--html", outputs.html, "write a self-contained HTML report with plots to FILE")
      ->check(kNonEmpty);
  auto* against =
      run->add_option(
             "--against", outputs.against,
             "an accepted JSON report: exit 1 if a check's score grew or a check is new/missing")
          ->check(kNonEmpty);
  run->add_option("--against-factor", outputs.against_factor,
                  "growth of err(prod)/err(base) that counts as a regression (default 1.25)")
      ->needs(against);
  run->add_flag("--quiet", outputs.quiet, "print only failing cases and the summary");
  run->add_flag("--fail-fast", outputs.fail_fast,
                "stop at the first failing case (exit 1; the reports hold the cases run)");
  run->add_flag("--allow-unsupported", outputs.allow_unsupported,
                "exit 0 when the implementation declined every case (default: exit 2, nothing "
                "was judged)");
  run->add_option("--dist-timeout", outputs.dist_timeout,
                  "under torchrun: seconds a rank waits for another (default 300)")
      ->check(CLI::Range(1, 86400));
  run->add_option("--inject", outputs.inject,
                  "run the production code as the named faulty variant (see gradscope faults)")
      ->check(kNonEmpty);
  run->add_option("--impl", outputs.impl.ns,
                  "operator namespace of the implementation under test (default gradscope; "
                  "docs/implementations.md)")
      ->check(kNonEmpty);
  run->add_option("--ops-library", outputs.impl.libraries,
                  "load this shared library first (it registers the --impl namespace)")
      ->check(kNonEmpty);
  std::string dq_dir, dq_module, dq_out;
  auto* dequant = app.add_subcommand(
      "dequant", "write one checkpoint module's dequantized weight (and codes, zeros) to HDF5");
  dequant->add_option("--checkpoint", dq_dir, "GPTQ checkpoint folder")
      ->required()
      ->check(kNonEmpty);
  dequant->add_option("--module", dq_module, "e.g. model.layers.0.mlp.down_proj")
      ->required()
      ->check(kNonEmpty);
  dequant->add_option("--out", dq_out, "HDF5 file to write")->required()->check(kNonEmpty);
  ExportOptions ex;
  std::string ex_format = "gptq";
  bool ex_asym = false;
  auto* exporter = app.add_subcommand("export", "write a small GPTQ checkpoint of seeded layers");
  exporter->add_option("--out", ex.dir, "new checkpoint folder")->required()->check(kNonEmpty);
  exporter->add_option("--layers", ex.layers, "decoder layers (default 1)")
      ->check(CLI::Range(1, 1024));
  exporter->add_option("--hidden", ex.hidden, "hidden size (default 256)")
      ->check(CLI::Range(1, 1 << 16));
  exporter->add_option("--intermediate", ex.intermediate, "MLP size (default 688)")
      ->check(CLI::Range(1, 1 << 17));
  exporter->add_option("--heads", ex.heads, "query heads (default 4)")->check(CLI::Range(1, 1024));
  exporter->add_option("--kv-heads", ex.kv_heads, "key/value heads (default 2)")
      ->check(CLI::Range(1, 1024));
  exporter->add_option("--bits", ex.bits, "2, 3, 4 or 8 (default 4)")
      ->check(CLI::IsMember({2, 3, 4, 8}));
  exporter->add_option("--group-size", ex.group_size, "rows per group, -1 = one (default 128)")
      ->check(CLI::Range(-1, 1 << 16));
  exporter->add_option("--format", ex_format, "gptq (v1) or gptq_v2 (default gptq)")
      ->check(CLI::IsMember({"gptq", "gptq_v2"}));
  exporter->add_flag("--asym", ex_asym, "asymmetric zero points (default symmetric)");
  exporter->add_flag("--desc-act", ex.desc_act, "act-order");
  exporter->add_flag("--static-groups", ex.static_groups, "static groups (with --desc-act)");
  exporter->add_option("--seed", ex.seed, "seed of the weights (default 1)")->check(kSeed);
  exporter->add_option("--shards", ex.shards, "safetensors files (default 1)")
      ->check(CLI::Range(1, 64));
  SampleCommand sample_cmd;
  RunOutputs sample_outputs;
  sample_outputs.quiet = true;
  bool sample_verbose = false;
  auto* sample = app.add_subcommand(
      "sample", "draw random valid cases over every kind and field and run them (false alarms)");
  sample->add_option("--count", sample_cmd.draw.count, "cases to draw (default 100)")
      ->check(CLI::Range(1, 1000000));
  sample->add_option("--seed", sample_cmd.draw.seed, "the sampler's seed (default 1)")
      ->check(kSeed);
  sample->add_option("--device", sample_cmd.draw.device, "device of every case (default cpu)")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  sample->add_option("--kinds", sample_cmd.draw.kinds, "only these kinds, e.g. lora_w,layer")
      ->delimiter(',');
  sample
      ->add_option("--cases-out", sample_cmd.cases_out,
                   "write each drawn case as a case file into this new folder (for replay)")
      ->check(kNonEmpty);
  sample
      ->add_option("--max-seconds", sample_cmd.max_seconds,
                   "stop starting cases after this many seconds (0: no bound)")
      ->check(kTolerance);
  sample->add_option("--json", sample_outputs.json, "write the JSON report to FILE")
      ->check(kNonEmpty);
  sample->add_option("--junit", sample_outputs.junit, "write JUnit XML to FILE")->check(kNonEmpty);
  sample->add_flag("--verbose", sample_verbose, "print every case, not only failing ones");
  sample
      ->add_option("--impl", sample_outputs.impl.ns,
                   "operator namespace of the implementation under test (default gradscope)")
      ->check(kNonEmpty);
  sample
      ->add_option("--ops-library", sample_outputs.impl.libraries,
                   "load this shared library first (it registers the --impl namespace)")
      ->check(kNonEmpty);
  auto* faults = app.add_subcommand("faults", "list the faults --inject can switch on");
  auto* list = app.add_subcommand("list", "print the id of every selected case");
  add_selection_options(list, list_sel);
  Selection coverage_sel;
  std::string coverage_json_file;
  auto* coverage = app.add_subcommand(
      "coverage", "what the selected cases reach: axis values, pairs, token and feature residues");
  add_selection_options(coverage, coverage_sel);
  coverage->add_option("--json", coverage_json_file, "write the coverage as JSON to FILE")
      ->check(kNonEmpty);
  std::string show_file, show_path;
  auto* show = app.add_subcommand("show", "print the tree of an HDF5 dump, or one group/tensor");
  show->add_option("file", show_file, "dump (HDF5)")->required();
  show->add_option("path", show_path, "group or dataset inside the dump");
  std::string diff_a, diff_b, diff_json;
  report::DiffOptions diff_options;
  auto* diff = app.add_subcommand("diff", "compare two dumps tensor by tensor");
  diff->add_option("a", diff_a, "first dump")->required();
  diff->add_option("b", diff_b, "second dump (the reference side of rtol)")->required();
  auto* rtol = diff->add_option("--rtol", diff_options.rtol, "relative tolerance (with --atol)")
                   ->check(kTolerance);
  auto* atol = diff->add_option("--atol", diff_options.atol, "absolute tolerance (with --rtol)")
                   ->check(kTolerance);
  rtol->needs(atol);
  atol->needs(rtol);
  diff->add_option("--json", diff_json, "write the comparison as JSON to FILE")->check(kNonEmpty);

  // CLI11 would answer an unknown first word with "A subcommand is required".
  if (argc > 1 && argv[1][0] != '-') {
    std::string known;
    bool found = false;
    for (const auto* sub : app.get_subcommands([](CLI::App*) { return true; })) {
      found = found || sub->get_name() == argv[1];
      known += (known.empty() ? "" : ", ") + sub->get_name();
    }
    if (!found) {
      std::cerr << "gradscope: error: unknown command '" << argv[1] << "'; expected one of "
                << known << "\n(run gradscope --help for usage)\n";
      return 2;
    }
  }
  if (const auto code = parse_command_line(app, argc, argv, "gradscope")) return *code;
  const std::string program = argc > 0 ? argv[0] : "gradscope";
  try {
    if (run->parsed()) return command_run(run_sel, outputs, program);
    if (sample->parsed()) {
      sample_outputs.quiet = !sample_verbose;
      return command_sample(sample_cmd, sample_outputs, program);
    }
    if (show->parsed()) return command_show(show_file, show_path);
    if (faults->parsed()) {
      if (!fault_switches_linked()) {
        throw InputError("faults: this program has no fault switches (" +
                         std::string(kNoSwitchesWhy) + ")");
      }
      return command_faults();
    }
    if (diff->parsed()) return command_diff(diff_a, diff_b, diff_options, diff_json);
    if (coverage->parsed()) return command_coverage(coverage_sel, coverage_json_file);
    if (dequant->parsed()) {
      check_outputs({{"--out", dq_out}}, {}, dq_dir);
      return command_dequant(std::cout, dq_dir, dq_module, dq_out);
    }
    if (exporter->parsed()) {
      if (ex.group_size == 0) throw InputError("--group-size must be -1 or positive");
      if (ex.static_groups && !ex.desc_act) throw InputError("--static-groups needs --desc-act");
      ex.format = parse_zero_point_format(ex_format);
      ex.sym = !ex_asym;
      return command_export(std::cout, ex);
    }
    return command_list(list_sel);
  } catch (const InputError& e) {
    std::cerr << "gradscope: error: " << e.what() << '\n';
    return 2;
  } catch (const std::runtime_error& e) {  // unreadable dumps, files that cannot be written
    std::cerr << "gradscope: error: " << e.what() << '\n';
    return 2;
  } catch (const std::bad_alloc&) {
    std::cerr << "gradscope: error: out of memory: the command needs more memory than this "
                 "machine has (a smaller shape or fewer cases)\n";
    return 2;
  } catch (const c10::Error& e) {  // e.g. an allocation of a size inside the accepted ranges
    std::cerr << "gradscope: error: " << e.what_without_backtrace() << '\n';
    return 2;
  }
}

int run_cli(const std::vector<std::string>& args) {
  std::vector<const char*> argv{"gradscope"};
  for (const auto& a : args) argv.push_back(a.c_str());
  return run_cli(static_cast<int>(argv.size()), argv.data());
}

}  // namespace gradscope

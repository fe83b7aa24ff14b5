#include "harness/cli/cli.h"
#include "harness/common/cli_parse.h"

#include <c10/util/Exception.h>

#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iostream>

#include "gradscope/faults.h"
#include "harness/catalog/case_coverage.h"
#include "harness/catalog/kind_registry.h"
#include "harness/checkpoint/checkpoint_writer.h"
#include "harness/checkpoint/gptq_config.h"
#include "harness/checkpoint/safetensors_file.h"
#include "harness/cli/case_selection.h"
#include "harness/cli/checkpoint_commands.h"
#include "harness/cli/output_paths.h"
#include "harness/cli/run_command.h"
#include "harness/cli/sample_command.h"
#include "harness/common/input_error.h"
#include "reports/dump_tools.h"
#include "reports/hdf5_dump.h"
#include "reports/output_file.h"

// The command line: each subcommand's options registered into a struct of its own, then
// dispatched to the function that does its work (run_command.cpp, sample_command.cpp,
// checkpoint_commands.cpp, and the small commands here).
namespace gradscope {
namespace {

int command_faults() {
  if (!fault_switches_linked()) {
    throw InputError("faults: this program has no fault switches (" + std::string(kNoSwitchesWhy) +
                     ")");
  }
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
int command_coverage(const CaseSelection& sel, const std::string& json) {
  check_outputs({{"--json", json}}, {});
  std::vector<CaseSpec> specs;
  for (auto& sc : select_cases(sel)) specs.push_back(std::move(sc.spec));
  const auto report = measure_coverage(specs);
  print_coverage(std::cout, report);
  if (!json.empty()) report::write_output_file(json, coverage_json(report).dump(2) + "\n");
  return report.missing() == 0 ? 0 : 1;
}

int command_list(const CaseSelection& sel) {
  for (const auto& sc : select_cases(sel)) std::cout << sc.id << '\n';
  return 0;
}

// `gradscope tensors`: one case's generated tensors, under the names its `tensors` field takes,
// to a safetensors file (what gradscope.make_case reads).
int command_tensors(const CaseSelection& sel, const std::string& out) {
  check_outputs({{"--out", out}}, {});
  const auto selected = select_cases(sel);
  if (selected.size() != 1) {
    throw InputError("tensors: the selection holds " + std::to_string(selected.size()) +
                     " cases; select one (--filter ID)");
  }
  const auto& sc = selected.front();
  std::vector<safetensors::OutputTensor> tensors;
  for (const auto& [name, t] : find_kind(sc.spec.kind)->generate(sc.spec, sc.id, RunOptions{})) {
    tensors.push_back(to_safetensors(name, t));
  }
  safetensors::write_file(out, std::move(tensors), {{"case_id", sc.id}});
  std::cout << sc.id << ": " << out << '\n';
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

// The implementation under test, for the commands that run cases (run, sample).
void add_impl_options(CLI::App* cmd, impl::ImplChoice& impl) {
  cmd->add_option("--impl", impl.ns,
                  "operator namespace of the implementation under test (default gradscope; "
                  "docs/implementations.md)")
      ->check(kNonEmpty);
  cmd->add_option("--ops-library", impl.libraries,
                  "load this shared library first (it registers the --impl namespace)")
      ->check(kNonEmpty);
  cmd->add_option("--import", impl.imports,
                  "a Python module that registers the --impl namespace (imported by python3 -m "
                  "gradscope; named in the replay line)")
      ->check(kNonEmpty)
      ->allow_extra_args(false);
}

void add_selection_options(CLI::App* cmd, CaseSelection& sel) {
  cmd->add_option("cases", sel.files, "case files (TOML)");
  cmd->add_option("--suite", sel.suite, "suite name: the folder cases/NAME (default smoke)")
      ->check(kNonEmpty);
  // One glob per --filter (repeat it for more), so a case file after it stays a case file.
  cmd->add_option("--filter", sel.filters, "only case ids matching this glob (repeatable: any)")
      ->check(kNonEmpty)
      ->allow_extra_args(false);
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

struct RunArgs {
  CaseSelection sel;
  ReportOptions o;
};

CLI::App* add_run(CLI::App& app, RunArgs& a) {
  auto* run = app.add_subcommand("run", "run cases and compare prod against the fp64 reference");
  add_selection_options(run, a.sel);
  run->add_option("--json", a.o.json, "write the JSON report to FILE")->check(kNonEmpty);
  auto* dump = run->add_option("--dump", a.o.dump,
                               "write an HDF5 dump of inputs and compared tensors to FILE")
                   ->check(kNonEmpty);
  run->add_flag("--dump-failing-only", a.o.dump_failing_only, "dump only failing cases")
      ->needs(dump);
  run->add_flag("--dump-gradients-only", a.o.dump_gradients_only,
                "dump only gradient checks, no inputs")
      ->needs(dump);
  run->add_option("--junit", a.o.junit, "write JUnit XML (one testcase per check) to FILE")
      ->check(kNonEmpty);
  run->add_option("--html", a.o.html, "write a self-contained HTML report with plots to FILE")
      ->check(kNonEmpty);
  auto* against =
      run->add_option(
             "--against", a.o.against,
             "an accepted JSON report: exit 1 if a check's score grew or a check is new/missing")
          ->check(kNonEmpty);
  run->add_option("--against-factor", a.o.against_factor,
                  "growth of err(prod)/err(base) that counts as a regression (default 1.25)")
      ->needs(against);
  run->add_flag("--quiet", a.o.quiet, "print only failing cases and the summary");
  run->add_flag("--fail-fast", a.o.fail_fast,
                "stop at the first failing case (exit 1; the reports hold the cases run)");
  run->add_flag("--allow-unsupported", a.o.allow_unsupported,
                "exit 0 when the implementation declined every case (default: exit 2, nothing "
                "was judged)");
  run->add_flag("--floor-on-host", a.o.floor_on_host,
                "compute the floor's products of squares on the host's BLAS for CUDA cases too "
                "(default: the large ones on the case's GPU, each checked on the host)");
  run->add_option("--dist-timeout", a.o.dist_timeout,
                  "under torchrun: seconds a rank waits for another (default 300)")
      ->check(CLI::Range(1, 86400));
  run->add_option("--inject", a.o.inject,
                  "run the production code as the named faulty variant (see gradscope faults)")
      ->check(kNonEmpty);
  add_impl_options(run, a.o.impl);
  return run;
}

struct DequantArgs {
  std::string dir, module, out;
};

CLI::App* add_dequant(CLI::App& app, DequantArgs& a) {
  auto* dequant = app.add_subcommand(
      "dequant", "write one checkpoint module's dequantized weight (and codes, zeros) to HDF5");
  dequant->add_option("--checkpoint", a.dir, "GPTQ checkpoint folder")
      ->required()
      ->check(kNonEmpty);
  dequant->add_option("--module", a.module, "e.g. model.layers.0.mlp.down_proj")
      ->required()
      ->check(kNonEmpty);
  dequant->add_option("--out", a.out, "HDF5 file to write")->required()->check(kNonEmpty);
  return dequant;
}

struct ExportArgs {
  ExportOptions options;
  std::string format = "gptq";
  bool asym = false;
};

CLI::App* add_export(CLI::App& app, ExportArgs& a) {
  auto* exporter = app.add_subcommand("export", "write a small GPTQ checkpoint of seeded layers");
  exporter->add_option("--out", a.options.dir, "new checkpoint folder")
      ->required()
      ->check(kNonEmpty);
  exporter->add_option("--layers", a.options.layers, "decoder layers (default 1)")
      ->check(CLI::Range(1, 1024));
  exporter->add_option("--hidden", a.options.hidden, "hidden size (default 256)")
      ->check(CLI::Range(1, 1 << 16));
  exporter->add_option("--intermediate", a.options.intermediate, "MLP size (default 688)")
      ->check(CLI::Range(1, 1 << 17));
  exporter->add_option("--heads", a.options.heads, "query heads (default 4)")
      ->check(CLI::Range(1, 1024));
  exporter->add_option("--kv-heads", a.options.kv_heads, "key/value heads (default 2)")
      ->check(CLI::Range(1, 1024));
  exporter->add_option("--bits", a.options.bits, "2, 3, 4 or 8 (default 4)")
      ->check(CLI::IsMember({2, 3, 4, 8}));
  exporter
      ->add_option("--group-size", a.options.group_size, "rows per group, -1 = one (default 128)")
      ->check(CLI::Range(-1, 1 << 16));
  exporter->add_option("--format", a.format, "gptq (v1) or gptq_v2 (default gptq)")
      ->check(CLI::IsMember({"gptq", "gptq_v2"}));
  exporter->add_flag("--asym", a.asym, "asymmetric zero points (default symmetric)");
  exporter->add_flag("--desc-act", a.options.desc_act, "act-order");
  exporter->add_flag("--static-groups", a.options.static_groups, "static groups (with --desc-act)");
  exporter->add_option("--seed", a.options.seed, "seed of the weights (default 1)")->check(kSeed);
  exporter->add_option("--shards", a.options.shards, "safetensors files (default 1)")
      ->check(CLI::Range(1, 64));
  return exporter;
}

struct SampleArgs {
  SampleCommand cmd;
  ReportOptions o;
  bool verbose = false;
};

CLI::App* add_sample(CLI::App& app, SampleArgs& a) {
  auto* sample = app.add_subcommand(
      "sample", "draw random valid cases over every kind and field and run them (false alarms)");
  sample->add_option("--count", a.cmd.draw.count, "cases to draw (default 100)")
      ->check(CLI::Range(1, 1000000));
  sample->add_option("--seed", a.cmd.draw.seed, "the sampler's seed (default 1)")->check(kSeed);
  sample->add_option("--device", a.cmd.draw.device, "device of every case (default cpu)")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  sample->add_option("--kinds", a.cmd.draw.kinds, "only these kinds, e.g. lora_w,layer")
      ->delimiter(',');
  auto* cases_out =
      sample
          ->add_option("--cases-out", a.cmd.cases_out,
                       "write each drawn case as a case file into this new folder (for replay)")
          ->check(kNonEmpty);
  sample->add_flag("--draw-only", a.cmd.draw_only, "write the drawn cases and run none")
      ->needs(cases_out);
  sample
      ->add_option("--max-seconds", a.cmd.max_seconds,
                   "stop starting cases after this many seconds (0: no bound)")
      ->check(kTolerance);
  sample->add_option("--json", a.o.json, "write the JSON report to FILE")->check(kNonEmpty);
  sample->add_option("--junit", a.o.junit, "write JUnit XML to FILE")->check(kNonEmpty);
  sample->add_flag("--verbose", a.verbose, "print every case, not only failing ones");
  add_impl_options(sample, a.o.impl);
  return sample;
}

struct CoverageArgs {
  CaseSelection sel;
  std::string json;
};

CLI::App* add_coverage(CLI::App& app, CoverageArgs& a) {
  auto* coverage = app.add_subcommand(
      "coverage", "what the selected cases reach: axis values, pairs, token and feature residues");
  add_selection_options(coverage, a.sel);
  coverage->add_option("--json", a.json, "write the coverage as JSON to FILE")->check(kNonEmpty);
  return coverage;
}

struct ShowArgs {
  std::string file, path;
};

CLI::App* add_show(CLI::App& app, ShowArgs& a) {
  auto* show = app.add_subcommand("show", "print the tree of an HDF5 dump, or one group/tensor");
  show->add_option("file", a.file, "dump (HDF5)")->required();
  show->add_option("path", a.path, "group or dataset inside the dump");
  return show;
}

struct DiffArgs {
  std::string a, b, json;
  report::DiffOptions options;
};

CLI::App* add_diff(CLI::App& app, DiffArgs& a) {
  auto* diff = app.add_subcommand("diff", "compare two dumps tensor by tensor");
  diff->add_option("a", a.a, "first dump")->required();
  diff->add_option("b", a.b, "second dump (the reference side of rtol)")->required();
  auto* rtol = diff->add_option("--rtol", a.options.rtol, "relative tolerance (with --atol)")
                   ->check(kTolerance);
  auto* atol = diff->add_option("--atol", a.options.atol, "absolute tolerance (with --rtol)")
                   ->check(kTolerance);
  rtol->needs(atol);
  atol->needs(rtol);
  diff->add_option("--json", a.json, "write the comparison as JSON to FILE")->check(kNonEmpty);

  return diff;
}

int command_export(const ExportArgs& a) {
  ExportOptions ex = a.options;
  if (ex.group_size == 0) throw InputError("--group-size must be -1 or positive");
  if (ex.static_groups && !ex.desc_act) throw InputError("--static-groups needs --desc-act");
  ex.format = parse_zero_point_format(a.format);
  ex.sym = !a.asym;
  return command_export(std::cout, ex);
}

int run_cli_as(int argc, const char* const* argv, const CliHost& host) {
  CLI::App app{"gradscope: proves quantized-LoRA training kernels compute the right gradients"};
  app.require_subcommand(1);
  RunArgs run_args;
  DequantArgs dequant_args;
  ExportArgs export_args;
  SampleArgs sample_args;
  sample_args.o.quiet = true;
  CaseSelection list_sel;
  CoverageArgs coverage_args;
  ShowArgs show_args;
  DiffArgs diff_args;
  auto* run = add_run(app, run_args);
  auto* dequant = add_dequant(app, dequant_args);
  auto* exporter = add_export(app, export_args);
  auto* sample = add_sample(app, sample_args);
  auto* faults = app.add_subcommand("faults", "list the faults --inject can switch on");
  auto* list = app.add_subcommand("list", "print the id of every selected case");
  add_selection_options(list, list_sel);
  CaseSelection tensors_sel;
  std::string tensors_out;
  auto* tensors = app.add_subcommand(
      "tensors", "write one case's generated tensors to a safetensors file (a case's `tensors`)");
  add_selection_options(tensors, tensors_sel);
  tensors->add_option("--out", tensors_out, "the safetensors file to write")
      ->required()
      ->check(kNonEmpty);
  auto* coverage = add_coverage(app, coverage_args);
  auto* show = add_show(app, show_args);
  auto* diff = add_diff(app, diff_args);

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
  const std::string& program = host.program;
  for (const auto* imports : {&run_args.o.impl.imports, &sample_args.o.impl.imports}) {
    if (!imports->empty() && !host.imports_modules) {
      std::cerr << "gradscope: error: --import " << imports->front()
                << ": importing a Python module needs the Python package: python3 -m gradscope "
                << argv[1] << " ... --import " << imports->front() << '\n';
      return 2;
    }
  }
  run_args.o.poll = sample_args.o.poll = host.poll;
  try {
    if (run->parsed()) return command_run(run_args.sel, run_args.o, program);
    if (sample->parsed()) {
      sample_args.o.quiet = !sample_args.verbose;
      return command_sample(sample_args.cmd, sample_args.o, program);
    }
    if (show->parsed()) return command_show(show_args.file, show_args.path);
    if (faults->parsed()) return command_faults();
    if (diff->parsed()) {
      return command_diff(diff_args.a, diff_args.b, diff_args.options, diff_args.json);
    }
    if (coverage->parsed()) return command_coverage(coverage_args.sel, coverage_args.json);
    if (dequant->parsed()) {
      check_outputs({{"--out", dequant_args.out}}, {}, dequant_args.dir);
      return command_dequant(std::cout, dequant_args.dir, dequant_args.module, dequant_args.out);
    }
    if (exporter->parsed()) return command_export(export_args);
    if (tensors->parsed()) return command_tensors(tensors_sel, tensors_out);
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

}  // namespace

int run_cli(int argc, const char* const* argv) {
  return run_cli_as(argc, argv, CliHost{argc > 0 ? argv[0] : "gradscope", false, {}});
}

int run_cli(const std::vector<std::string>& args, const CliHost& host) {
  std::vector<const char*> argv{host.program.c_str()};
  for (const auto& a : args) argv.push_back(a.c_str());
  return run_cli_as(static_cast<int>(argv.size()), argv.data(), host);
}

}  // namespace gradscope

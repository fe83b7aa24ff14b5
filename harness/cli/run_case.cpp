#include "harness/cli/run_case.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <chrono>
#include <new>

#include "harness/catalog/kind_registry.h"
#include "harness/common/host_memory.h"
#include "harness/common/input_error.h"
#include "harness/distributed/process_ranks.h"
#include "harness/generate/gptq_layer_gen.h"
#include "harness/impl/impl_ops.h"

namespace gradscope {
namespace {

std::string shell_quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

// The command that runs this case alone, as the user's run selected it.
std::string replay_line(const SelectedCase& sc, const std::string& program,
                        const RunOptions& options) {
  const std::string checkpoint = sc.spec.kind == "dequant" ? "" : sc.spec.get_string("checkpoint");
  // A sampled case's file is named through the shell variable its setup sets: double quotes.
  const std::string file =
      sc.replay_file.empty() ? shell_quote(sc.spec.file) : "\"" + sc.replay_file + "\"";
  const std::string source = checkpoint.empty() || checkpoint != sc.spec.file
                                 ? file
                                 : "--checkpoint " + shell_quote(checkpoint) + " --layers " +
                                       std::to_string(sc.spec.get_int("layer"));
  std::string replay = (sc.replay_setup.empty() ? "" : sc.replay_setup + " && ") + program +
                       " run " + source + " --filter " + shell_quote(sc.id) + " --device " +
                       sc.spec.get_string("device") + " --dtype " + sc.spec.get_string("dtype") +
                       " --seed " + std::to_string(sc.spec.get_int("seed"));
  if (options.impl != "gradscope") replay += " --impl " + shell_quote(options.impl);
  for (const auto& lib : options.ops_libraries) replay += " --ops-library " + shell_quote(lib);
  for (const auto& mod : options.imports) replay += " --import " + shell_quote(mod);
  return replay;
}

// Runs the case's phases into `result`. What the case raised is classified: a broken launch
// ends the run, the case's size or input makes it invalid, a declined case is unsupported, and
// anything prod raised is a failing check.
void run_classified(const SelectedCase& sc, const RunOptions& options, report::CaseResult& result) {
  try {
    auto output = find_kind(sc.spec.kind)->run(sc.spec, sc.id, options);
    result.checks = std::move(output.checks);
    result.metrics = std::move(output.metrics);
    result.loss_curve = std::move(output.loss_curve);
    result.inputs = std::move(output.inputs);
    // A result the case's formats or the floor's model cannot hold makes the case invalid, not
    // failed; but a check that fails outright beside it is a verdict on prod, and the case fails.
    const bool failed = std::any_of(result.checks.begin(), result.checks.end(),
                                    [](const auto& c) { return !c.passed && !c.out_of_range; });
    for (const auto& check : result.checks) {
      if (check.out_of_range && !failed) {
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
}

}  // namespace

report::CaseResult run_case(const SelectedCase& sc, const std::string& program,
                            const RunOptions& options) {
  report::CaseResult result;
  result.id = sc.id;
  result.kind = sc.spec.kind;
  result.source = sc.spec.file;
  result.spec = sc.spec.fields();
  result.spec_toml = sc.spec.to_toml();
  result.replay = replay_line(sc, program, options);
  const auto start = std::chrono::steady_clock::now();
  // Refused before anything is allocated: a case that cannot fit would be killed by the
  // kernel's out-of-memory handler part way, not fail with a message.
  const double at_least = find_kind(sc.spec.kind)->host_bytes_at_least(sc.spec);
  const double memory = host_memory_bytes();
  // The seeded layers kept from earlier cases give way to a case that needs the memory.
  if (memory > 0 && at_least + kept_layer_bytes() > memory) drop_kept_layers();
  if (memory > 0 && at_least > memory) {
    result.input_error = sc.id + ": needs at least " + format_gib(at_least) +
                         " of host memory (the reference's fp64 weights and activations); this "
                         "machine has " +
                         format_gib(memory);
    return result;
  }
  run_classified(sc, options, result);
  impl::after_case();
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return result;
}

}  // namespace gradscope

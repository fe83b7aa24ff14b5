// The case engine: a kind declares what it is (fields, rules, id, the operators it calls) and
// how one case is tested (a Testbed with fixed phases); the engine runs the phases in order,
// times them and hands back the checks. docs/architecture.md "Adding a kind" walks through it.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

#include "harness/spec/case_spec.h"
#include "reports/report_types.h"

namespace gradscope {

class CaseDraw;
class ProcessRanks;

// Thrown by RunOptions::poll to stop a run from outside (a host program's interrupt, such as
// Ctrl-C under Python): deliberately no std::exception, so that no case takes it for its own
// error; the run ends, its outputs unwritten (docs/python.md).
struct RunInterrupted {};

struct RunOptions {
  bool keep_tensors = false;  // keep compared tensors and generated inputs (for dumps)
  // ref and floor on a host thread beside base (PhasePlan); unset: on CUDA only, where the
  // baseline is device work. Set for a CPU case by the tests of that overlap.
  std::optional<bool> overlap_judges;
  // The floor's fp32 products of squares on this host's BLAS even for a CUDA case
  // (--floor-on-host); else the large ones run on the case's GPU (engine/judge_device.h).
  bool floor_on_host = false;
  // The namespace whose operators are prod (--impl; harness/impl/impl_ops.h).
  std::string impl = "gradscope";
  std::vector<std::string> ops_libraries;  // loaded for it (--ops-library), for the replay line
  std::vector<std::string> imports;        // imported for it (--import), for the replay line
  // Called between a case's phases (and by the run between cases); throws RunInterrupted to
  // stop. Unset: nothing stops a run but its end or a signal's default action.
  std::function<void()> poll;
  // Under torchrun: this process's rank among the launched processes; a collective case (kind
  // fsdp) runs its part of the case here, and its group's keys begin with case_key.
  ProcessRanks* ranks = nullptr;
  std::string case_key;
};

using Metrics = std::vector<std::pair<std::string, double>>;

// What one case hands back: every check (paths prefixed by the case id), the generated inputs
// when tensors are kept, metrics (reported, not gated) and a training kind's loss curve.
struct CaseResult {
  std::vector<report::Check> checks;
  std::vector<std::pair<std::string, report::TensorData>> inputs;
  Metrics metrics;
  std::optional<report::LossCurve> loss_curve;
};

// The phases of one case, CUTLASS-style: generate the inputs, run the implementation under
// test (prod) and the unfused baseline (base), run the fp64 reference (ref) and the rounding
// noise model of a careful implementation (floor), then verify. The kind's state between
// phases lives in its Testbed. On CUDA, unless judges_first, ref and floor run on a host
// thread while base runs (after prod): neither may write what the other reads.
struct PhasePlan {
  bool base = true;           // the kind runs a baseline
  bool floor = true;          // and a floor apart from the reference
  bool judges_first = false;  // ref and floor run before prod and base, which take their values
};

class Testbed {
 public:
  virtual ~Testbed() = default;
  virtual PhasePlan plan() const { return {}; }
  virtual void generate() = 0;
  virtual void prod() = 0;
  virtual void base() {}
  virtual void ref() = 0;
  virtual void floor() {}
  // The checks, the inputs to keep and any metrics of the kind's own, from what the phases left.
  virtual void verify(CaseResult& out) = 0;
  // After generate: every generated tensor the implementations and the reference compute from,
  // under the names a case's `tensors` file takes (docs/case-files.md); empty: the kind does
  // not list them.
  virtual std::vector<std::pair<std::string, at::Tensor>> generated() const { return {}; }
};

// Where and how a case runs, as its testbed is given it.
struct CaseContext {
  const CaseSpec& spec;
  const std::string& id;
  const RunOptions& options;
};

// An output gradient a case takes, and the output it is the gradient of.
struct CaseGradient {
  std::string name;    // dq, dy
  std::string output;  // q_proj, down_proj; "output" for a decoder layer's
};

// A projection or norm of a case's module and the stream its tensors are drawn from.
struct CasePart {
  std::string path;    // where it sits in the module: q_proj, self_attn.q_proj, input_layernorm
  std::string stream;  // its tensors' names' prefix: o_proj, layers.1.q_proj, layers.1.input_norm
  int64_t layer = 0;   // in a stack, its layer (from 1, as the streams count); else 0
};

// A kind as data. catalog/kind_registry.cpp lists the declarations.
struct KindDecl {
  std::string name;
  std::vector<FieldSpec> fields;  // the kind's own fields (besides kind, seed, dtype, device)
  // The id encodes the configuration, so a failing line says what failed.
  std::function<std::string(const CaseSpec&)> case_id;
  // Cross-field rules (impossible shapes); throws InputError naming the field.
  std::function<void(const CaseSpec&)> validate;
  // The operators of the implementation under test the kind calls (harness/impl/impl_ops.h);
  // empty: the kind runs gradscope's own kernels directly and takes no other --impl.
  std::vector<std::string> prod_ops;
  // Set where a case's fields choose among them (kind layer's prod_calls): the operators that
  // case calls, in place of prod_ops.
  std::function<std::vector<std::string>(const CaseSpec&)> prod_ops_of_case;
  // A lower bound of the host memory a case holds at once (the reference's fp64 dense
  // weights and activations): a case above the machine's memory is refused before anything
  // is allocated. Unset: no bound known.
  std::function<double(const CaseSpec&)> host_bytes_at_least;
  // Under torchrun, the processes that run a case together (kind fsdp: its world_size); unset
  // or 0: any one process runs it, and a suite spreads such cases over them.
  std::function<int64_t(const CaseSpec&)> processes_needed;
  // The names a case takes its activation and output gradients by (a `tensors` file's, or a
  // host program's tensors: x, dy; dq, dk, dv); unset: the kind takes none.
  std::function<std::vector<std::string>(const CaseSpec&)> inputs;
  // The output each of inputs() but x is the gradient of (dq: q_proj; dy: down_proj, output).
  std::function<std::vector<CaseGradient>(const CaseSpec&)> gradients;
  // The projections and norms a host program may hand the case the tensors of (a reader of a
  // user's module, docs/python.md), with the streams the case draws them from.
  std::function<std::vector<CasePart>(const CaseSpec&)> parts;
  std::function<std::unique_ptr<Testbed>(const CaseContext&)> testbed;
  // Draws the kind's own fields of a random valid case (`gradscope sample`); unset: the
  // sampler does not draw the kind.
  std::function<void(CaseDraw&)> sample;
};

// Times one phase: wall time (on CUDA after a synchronize) and, when asked on CUDA, the peak
// memory the caching allocator handed out during it.
class PhaseTimer {
 public:
  PhaseTimer(bool cuda, bool track_memory);
  // Appends <name>.seconds and, when tracking memory, <name>.peak_allocated_gib; returns the
  // seconds.
  double finish(const std::string& name, Metrics& metrics);
  // The seconds since construction, recorded nowhere (a part of a phase).
  double seconds();

 private:
  // Read only where CUDA is built in.
  [[maybe_unused]] bool cuda_, track_memory_;
  std::chrono::steady_clock::time_point start_;
};

class CaseKind {
 public:
  explicit CaseKind(KindDecl decl);
  const std::string& name() const { return decl_.name; }
  const std::vector<FieldSpec>& fields() const { return decl_.fields; }
  std::string case_id(const CaseSpec& spec) const { return decl_.case_id(spec); }
  void validate(const CaseSpec& spec) const { decl_.validate(spec); }
  // The operators of --impl this case calls.
  std::vector<std::string> prod_ops(const CaseSpec& spec) const;
  double host_bytes_at_least(const CaseSpec& spec) const;
  int64_t processes_needed(const CaseSpec& spec) const;
  bool sampled() const { return static_cast<bool>(decl_.sample); }
  std::vector<std::string> inputs(const CaseSpec& spec) const {
    return decl_.inputs ? decl_.inputs(spec) : std::vector<std::string>{};
  }
  std::vector<CaseGradient> gradients(const CaseSpec& spec) const {
    return decl_.gradients ? decl_.gradients(spec) : std::vector<CaseGradient>{};
  }
  std::vector<CasePart> parts(const CaseSpec& spec) const {
    return decl_.parts ? decl_.parts(spec) : std::vector<CasePart>{};
  }
  void sample(CaseDraw& draw) const { decl_.sample(draw); }
  // Runs the case's phases and returns every check, paths prefixed by `id`.
  CaseResult run(const CaseSpec& spec, const std::string& id, const RunOptions& options) const;
  // Runs only the generate phase and returns Testbed::generated(); throws InputError for a kind
  // that does not list them.
  std::vector<std::pair<std::string, at::Tensor>> generate(const CaseSpec& spec,
                                                           const std::string& id,
                                                           const RunOptions& options) const;

 private:
  KindDecl decl_;
};

}  // namespace gradscope

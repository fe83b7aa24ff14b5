// One runner per case kind behind one interface; catalog/runner_registry.cpp lists them.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "harness/spec/case_spec.h"
#include "reports/report_types.h"

namespace gradscope {

class ProcessRanks;

struct RunOptions {
  bool keep_tensors = false;  // keep compared tensors and generated inputs (for dumps)
  // The namespace whose operators are prod (--impl; harness/impl/impl_ops.h).
  std::string impl = "gradscope";
  std::vector<std::string> ops_libraries;  // loaded for it (--ops-library), for the replay line
  // Under torchrun: this process's rank among the launched processes; a collective case (kind
  // fsdp) runs its part of the case here, and its group's keys begin with case_key.
  ProcessRanks* ranks = nullptr;
  std::string case_key;
};

struct RunOutput {
  std::vector<report::Check> checks;
  std::vector<std::pair<std::string, report::TensorData>> inputs;  // when keep_tensors
  std::vector<std::pair<std::string, double>> metrics;             // reported, not gated
  std::optional<report::LossCurve> loss_curve;                     // training kinds
};

class CaseRunner {
 public:
  virtual ~CaseRunner() = default;
  virtual std::string kind() const = 0;
  // The kind's own fields (besides kind, seed, dtype, device).
  virtual std::vector<FieldSpec> fields() const = 0;
  // The id encodes the configuration, so a failing line says what failed.
  virtual std::string case_id(const CaseSpec& spec) const = 0;
  // Cross-field rules (impossible shapes); throws InputError naming the field.
  virtual void validate(const CaseSpec& spec) const = 0;
  // The operators of the implementation under test this kind calls (harness/impl/impl_ops.h);
  // empty: the kind runs gradscope's own kernels directly and takes no other --impl.
  virtual std::vector<std::string> prod_ops() const { return {}; }
  // A lower bound of the host memory the case holds at once (the reference's fp64 dense
  // weights and activations): a case whose bound exceeds the machine's memory is refused
  // before anything is allocated. 0: no bound known.
  virtual double host_bytes_at_least(const CaseSpec&) const { return 0; }
  // Under torchrun, the processes that run the case together (kind fsdp: its world_size, one
  // rank each); 0: the case runs in any one process, and a suite spreads such cases over them.
  virtual int64_t processes_needed(const CaseSpec&) const { return 0; }
  // Runs prod and the reference and returns every check, paths prefixed by `id`.
  virtual RunOutput run(const CaseSpec& spec, const std::string& id,
                        const RunOptions& options) const = 0;
};

}  // namespace gradscope

// The fsdp kind's sharded run: world_size ranks, as threads of this process (each with its
// own c10d group) or as this process's rank under torchrun, each gathering the sharded
// QuantLinear modules, running its slice of the tokens and reduce-scattering the adapter
// gradients (docs/distributed.md).
#pragma once

#include <map>
#include <string>
#include <vector>

#include "gradscope/fsdp_shards.h"
#include "harness/kinds/lora_testbed.h"

namespace gradscope::fsdp_ranks {

namespace tb = lora_testbed;

// The case's sharding fields (world_size, sharding, storage, param_dtype), declared and read here.
struct FsdpConfig {
  int64_t world_size;
  ShardingStrategy strategy;
  std::string storage;  // int32 or the float view dtype
  explicit FsdpConfig(const CaseSpec& s)
      : world_size(s.get_int("world_size")),
        strategy(s.get_string("sharding") == "flat" ? ShardingStrategy::kFlat
                                                    : ShardingStrategy::kPerParameter),
        storage(s.get_string("storage")) {}
  bool float_view() const { return storage != "int32"; }
  static std::vector<FieldSpec> fields();
  // What the fields' ranges cannot say: equal slices of `tokens`, a policy that keeps the words.
  static void validate(const CaseSpec& s, int64_t tokens);
};

// What one rank reports back.
struct RankResult {
  std::vector<report::Check> checks;
  std::map<std::string, tb::AdapterGrads>
      adapter_grads;  // by projection, summed over ranks (rank 0)
};

// What the ranks read of the case, on the host. The case's tensors live on the main thread's
// device (GPU 0 on CUDA): a rank reading them there would queue its copies on GPU 0's
// default stream, which rank 0's collectives hold (wait() makes that stream wait for
// them), so rank 1 could block behind a collective that needs rank 1 and the group would
// hang in its first reduce-scatter.
struct HostCase {
  std::vector<std::string> names;  // the projections' names, in the order of the vectors below
  std::vector<GptqWeight> base;
  std::vector<at::Tensor> lora_A, lora_B;
  at::Tensor x2, dy2;  // [tokens, hidden]
  HostCase(const std::vector<tb::Projection>& p, const at::Tensor& x2_, const at::Tensor& dy2_)
      : x2(x2_.cpu()), dy2(dy2_.cpu()) {
    for (const auto& proj : p) {
      names.push_back(proj.name);
      base.push_back(proj.prod.base.to(at::kCPU));
      lora_A.push_back(proj.prod.lora_A.detach().cpu());
      lora_B.push_back(proj.prod.lora_B.detach().cpu());
    }
  }
};

// Every rank's part in threads of this process, rank r on GPU r.
std::vector<RankResult> run_as_threads(const tb::Config& c, const FsdpConfig& f,
                                       const std::string& id, const HostCase& host);
// This process's rank under torchrun (on GPU LOCAL_RANK): every rank's checks travel to
// rank 0, which returns them all; the other ranks return none. A rank that fails here
// fails the run (the group's state is unknown): RankFailure, after telling the others.
std::vector<RankResult> run_as_process(const tb::Config& c, const FsdpConfig& f,
                                       const std::string& id, const HostCase& host,
                                       const RunOptions& options);

}  // namespace gradscope::fsdp_ranks

#include "harness/kinds/fsdp_ranks.h"

#include <ATen/ATen.h>
#ifdef GRADSCOPE_WITH_CUDA
#include <c10/cuda/CUDAFunctions.h>
#endif
#include <chrono>
#include "gradscope/fsdp_shards.h"
#include "gradscope/quant_linear.h"
#include "harness/checkpoint/checkpoint_reader.h"
#include "harness/common/dtypes.h"
#include "harness/common/file_system.h"
#include "harness/common/input_error.h"
#include "harness/common/tensor_bridge.h"
#include "harness/distributed/process_ranks.h"
#include "harness/distributed/thread_ranks.h"
#include "harness/kinds/kind_decls.h"
#include "harness/kinds/lora_testbed.h"
#include "harness/verdict/compare.h"
#include "reports/case_wire.h"

namespace gradscope::fsdp_ranks {

std::vector<FieldSpec> FsdpConfig::fields() {
  const auto s = [](const char* v) { return report::SpecValue(std::string(v)); };
  return {
      FieldSpec("world_size", FieldType::kInt, int64_t{2},
                "ranks (threads, or processes under torchrun; Gloo on the CPU, NCCL on CUDA)")
          .in_range(1, 64),
      FieldSpec("sharding", FieldType::kString, s("flat"),
                "flat: FSDP1 flat parameters per dtype; per_param: FSDP2 dim-0 shards")
          .one_of({s("flat"), s("per_param")}),
      FieldSpec("storage", FieldType::kString, s("bf16"),
                "packed words in int32 buffers (replicated) or as a float view (sharded)")
          .one_of({s("int32"), s("fp32"), s("fp16"), s("bf16")}),
      FieldSpec("param_dtype", FieldType::kString, s(""),
                "the mixed-precision policy's parameter dtype; empty: the storage dtype"),
  };
}

void FsdpConfig::validate(const CaseSpec& s, int64_t tokens) {
  const FsdpConfig f(s);
  if (tokens % f.world_size != 0) {
    throw_field_error(s, "world_size",
                      "must divide the " + std::to_string(tokens) +
                          " tokens (each rank takes an equal slice), got " +
                          std::to_string(f.world_size));
  }
  const std::string param_dtype = s.get_string("param_dtype");
  if (!param_dtype.empty() && param_dtype != "fp32" && param_dtype != "fp16" &&
      param_dtype != "bf16") {
    throw_field_error(s, "param_dtype",
                      "must be fp32, fp16, bf16 or empty, got \"" + param_dtype + "\"");
  }
  if (f.float_view() && !param_dtype.empty() && param_dtype != f.storage) {
    throw_field_error(s, "param_dtype",
                      "is " + param_dtype + " but the packed words are stored as a " + f.storage +
                          " view: the policy would cast them numerically and "
                          "destroy them; store them as " +
                          param_dtype + " (storage) or keep param_dtype = \"" + f.storage + "\"");
  }
}

namespace {

at::Device device_of(const tb::Config& c, int64_t gpu);
// One rank's part of the case: gather, forward and backward on its slice, reduce-scatter,
// the state dict and the cast guard; its checks and (rank 0) the summed gradients in `out`.
void run_rank(const tb::Config& c, const FsdpConfig& f, const std::string& id, const HostCase& host,
              const c10::intrusive_ptr<c10d::Backend>& backend, int64_t r, const at::Device device,
              const std::string& scratch, RankResult& out);

}  // namespace

// Every rank's part in threads of this process, rank r on GPU r.
std::vector<RankResult> run_as_threads(const tb::Config& c, const FsdpConfig& f,
                                       const std::string& id, const HostCase& host) {
  std::vector<RankResult> ranks(f.world_size);
  const std::string scratch = files::make_temp_dir("gradscope-fsdp");
  const auto errors =
      run_thread_ranks(static_cast<int>(f.world_size), c.device.type(), std::chrono::seconds(120),
                       [&](int r, const c10::intrusive_ptr<c10d::Backend>& backend) {
                         run_rank(c, f, id, host, backend, r, device_of(c, r), scratch, ranks[r]);
                       });
  files::remove_tree(scratch);
  // Every rank's error: the first rank's may only be a timeout waiting for another's.
  std::string failed;
  for (int64_t r = 0; r < f.world_size; ++r) {
    if (!errors[r].empty()) failed += "\n  rank " + std::to_string(r) + ": " + errors[r];
  }
  if (!failed.empty()) throw std::runtime_error("fsdp ranks failed:" + failed);
  return ranks;
}

// This process's rank under torchrun (on GPU LOCAL_RANK): every rank's checks travel to
// rank 0, which returns them all; the other ranks return none. A rank that fails here
// fails the run (the group's state is unknown): RankFailure, after telling the others.
std::vector<RankResult> run_as_process(const tb::Config& c, const FsdpConfig& f,
                                       const std::string& id, const HostCase& host,
                                       const RunOptions& options) {
  auto& ranks = *options.ranks;
  RankResult mine;
  const std::string scratch = files::make_temp_dir("gradscope-fsdp");
  try {
    // The group forming and every collective of this rank's part, bounded as a whole.
    const ProcessRanks::Watch watch(ranks, id + "'s process group and collectives");
    const auto backend = ranks.new_group(c.device.type(), options.case_key);
    run_rank(c, f, id, host, backend, ranks.rank(), device_of(c, ranks.local_rank()), scratch,
             mine);
#ifdef GRADSCOPE_WITH_CUDA
    // Nothing of this rank's in flight when its group goes (see run_thread_ranks).
    if (c.device.is_cuda()) c10::cuda::device_synchronize();
#endif
  } catch (const RankFailure&) {
    files::remove_tree(scratch);
    throw;
  } catch (const std::exception& e) {
    files::remove_tree(scratch);
    const auto* c10_error = dynamic_cast<const c10::Error*>(&e);
    const std::string message = id + " failed on rank " + std::to_string(ranks.rank()) + ": " +
                                (c10_error ? c10_error->what_without_backtrace() : e.what());
    ranks.fail(message);
    throw RankFailure(message);
  }
  files::remove_tree(scratch);
  ranks.publish(options.case_key + "/checks", report::checks_to_wire(mine.checks));
  if (ranks.rank() != 0) return {};
  const auto wires = ranks.collect(options.case_key + "/checks");
  std::vector<RankResult> all(f.world_size);
  for (int64_t r = 1; r < f.world_size; ++r) all[r].checks = report::checks_from_wire(wires[r]);
  all[0] = std::move(mine);
  return all;
}

namespace {

at::Device device_of(const tb::Config& c, int64_t gpu) {
  return c.device.is_cuda() ? at::Device(at::kCUDA, static_cast<int8_t>(gpu))
                            : at::Device(at::kCPU);
}

// One rank's part of a case, step by step: the modules loaded and sharded, the all-gather, the
// forward and backward on its slice with the reduce-scatter, the state dict, the cast guard.
class RankRun {
 public:
  RankRun(const tb::Config& c, const FsdpConfig& f, const std::string& id, const HostCase& host,
          int64_t r, const at::Device device, const std::string& scratch, RankResult& out)
      : c_(c),
        f_(f),
        id_(id),
        host_(host),
        r_(r),
        device_(device),
        scratch_(scratch),
        out_(out),
        where_(id + "/rank" + std::to_string(r) + "/") {}

  void load(const c10::intrusive_ptr<c10d::Backend>& backend) {
    QuantLinearOptions qo;
    qo.storage = f_.float_view() ? PackedStorage::kFloatParameters : PackedStorage::kInt32Buffers;
    if (f_.float_view()) qo.view_dtype = dtype_from_name(f_.storage);
    qo.rank = c_.rank;
    qo.scaling = c_.scaling();
    qo.adapter_dtype = c_.adapter_dtype;
    for (size_t j = 0; j < host_.base.size(); ++j) {
      modules_.emplace_back(host_.base[j], at::Tensor(), qo);
      auto& m = modules_.back();
      // Built on the host from the packed tensors. Buffers (int32 storage) stay whole on
      // every rank, as FSDP leaves buffers unsharded; parameters reach the device only as
      // this rank's shards (below), never whole.
      if (!f_.float_view()) m->to(device_);
      {
        const at::NoGradGuard no_grad;
        m->lora_A.copy_(host_.lora_A[j]);  // from the host, as a rank loads a state dict
        m->lora_B.copy_(host_.lora_B[j]);
      }
      // The adapters as loaded, before any collective: with the check after the all-gather
      // below, a wrong copy and a failed gather tell themselves apart.
      check_adapters(j, "loaded", "as loaded vs the case's");
      for (const auto& item : m->named_parameters()) {
        if (item.key() == "lora_A" || item.key() == "lora_B") {
          adapters_.push_back(item.value());
          adapter_names_.push_back(host_.names[j] + "." + item.key());
        } else {
          frozen_.push_back(item.value());
          frozen_before_.push_back(item.value().detach().clone());
          frozen_names_.push_back(host_.names[j] + "." + item.key());
        }
      }
    }
    if (!frozen_.empty()) {
      frozen_shards_ = std::make_unique<ShardedParameters>(frozen_, f_.strategy, backend, device_);
    }
    adapter_shards_ = std::make_unique<ShardedParameters>(adapters_, f_.strategy, backend, device_);
  }

  void gather() {
    if (frozen_shards_) frozen_shards_->gather();
    adapter_shards_->gather();
    for (size_t j = 0; j < modules_.size(); ++j) {
      const auto words = modules_[j]->packed();
      const auto& original = host_.base[j];
      const std::string path = where_ + "gathered/" + host_.names[j] + "/gptq/";
      const char* compared = "after all-gather vs before sharding";
      out_.checks.push_back(
          compare_exact(path + "qweight", compared, words.qweight, original.qweight.to(at::kLong)));
      out_.checks.push_back(
          compare_exact(path + "qzeros", compared, words.qzeros, original.qzeros.to(at::kLong)));
      out_.checks.push_back(
          compare_exact(path + "scales", compared, words.scales, original.scales.to(at::kDouble)));
      check_adapters(j, "gathered", compared);
    }
  }

  // This rank's slice of the tokens; the loss is a sum, so the gradients add over ranks.
  void forward_backward() {
    const int64_t slice = host_.x2.size(0) / f_.world_size;
    const auto projection = [&](size_t j) {
      return LoraProjection{modules_[j]->packed(), at::Tensor(), modules_[j]->lora_A,
                            modules_[j]->lora_B, c_.scaling()};
    };
    const auto slice_of = [&](const at::Tensor& t) {
      return t.narrow(0, r_ * slice, slice).to(device_);
    };
    const auto y = lora_mlp(slice_of(host_.x2), projection(0), projection(1), projection(2));
    y.backward(slice_of(host_.dy2));
    // Backward computes gradients and nothing else: the adapters a rank trains on next step
    // must still be the case's, bit for bit (an op that writes into its inputs fails here).
    for (size_t j = 0; j < modules_.size(); ++j) {
      check_adapters(j, "after_backward", "after backward vs the case's");
    }
    std::vector<at::Tensor> grads;
    for (const auto& a : adapters_) grads.push_back(a.grad());
    const auto grad_shards = adapter_shards_->reduce_scatter(grads);
    adapter_shards_->release();
    if (frozen_shards_) frozen_shards_->release();
    const auto summed = adapter_shards_->gather_copy(grad_shards);  // in the order of adapters_
    if (r_ != 0) return;
    std::map<std::string, at::Tensor> by_name;
    for (size_t i = 0; i < summed.size(); ++i) by_name[adapter_names_[i]] = summed[i];
    for (const auto& name : host_.names) {
      out_.adapter_grads[name] = {by_name.at(name + ".lora_A"), by_name.at(name + ".lora_B")};
    }
  }

  // A state dict from the shards (every rank gathers; rank 0 writes and reloads it).
  void state_dict() {
    const auto full = frozen_shards_ ? frozen_shards_->gather_copy(frozen_shards_->shards())
                                     : std::vector<at::Tensor>{};
    if (r_ != 0 || full.empty()) return;
    std::vector<safetensors::OutputTensor> tensors;
    for (size_t i = 0; i < full.size(); ++i) {
      tensors.push_back(to_safetensors(frozen_names_[i], full[i]));
    }
    const std::string path = scratch_ + "/state_dict.safetensors";
    safetensors::write_file(path, tensors, {});
    const safetensors::File file(path);
    for (size_t i = 0; i < full.size(); ++i) {
      out_.checks.push_back(compare_bits(id_ + "/state_dict/" + frozen_names_[i],
                                         "reloaded from a state dict of the shards vs before "
                                         "sharding",
                                         from_safetensors(file, *file.find(frozen_names_[i])),
                                         frozen_before_[i]));
    }
  }

  // The cast guard: a numeric round trip of one shard through another float dtype (a
  // mixed-precision policy that casts) must be refused by name, not computed on.
  void cast_guard() {
    if (!frozen_shards_) return;
    auto& shard = frozen_shards_->shards().front();
    const auto other = shard.scalar_type() == at::kHalf ? at::kBFloat16 : at::kHalf;
    const auto saved = shard.clone();
    shard.copy_(shard.to(other).to(shard.scalar_type()));
    frozen_shards_->gather();
    std::string message;
    try {
      for (auto& m : modules_) m->check_packed_intact();
    } catch (const c10::Error& e) {
      message = e.what_without_backtrace();
    }
    // Refused, and by the name of a packed tensor.
    const bool named = message.find("qweight") != std::string::npos ||
                       message.find("qzeros") != std::string::npos ||
                       message.find("scales") != std::string::npos ||
                       message.find("g_idx") != std::string::npos;
    out_.checks.push_back(expect_rejection(
        where_ + "cast_guard", "a numerically cast shard refused by name", named,
        message.empty() ? "the words were cast and nothing noticed" : "message: " + message));
    shard.copy_(saved);
    frozen_shards_->release();
  }

 private:
  // Module j's adapters bit for bit against the case's, under `stage` (loaded, gathered).
  void check_adapters(size_t j, const std::string& stage, const std::string& compared) {
    const std::string path = where_ + stage + "/" + host_.names[j] + "/";
    out_.checks.push_back(compare_exact(path + "lora_A", compared,
                                        modules_[j]->lora_A.detach().cpu(),
                                        host_.lora_A[j].to(at::kDouble)));
    out_.checks.push_back(compare_exact(path + "lora_B", compared,
                                        modules_[j]->lora_B.detach().cpu(),
                                        host_.lora_B[j].to(at::kDouble)));
  }

  const tb::Config& c_;
  const FsdpConfig& f_;
  const std::string& id_;
  const HostCase& host_;
  const int64_t r_;
  const at::Device device_;
  const std::string& scratch_;
  RankResult& out_;
  const std::string where_;
  std::vector<QuantLinear> modules_;
  std::vector<at::Tensor> frozen_, adapters_, frozen_before_;
  std::vector<std::string> frozen_names_, adapter_names_;
  std::unique_ptr<ShardedParameters> frozen_shards_, adapter_shards_;
};

void run_rank(const tb::Config& c, const FsdpConfig& f, const std::string& id, const HostCase& host,
              const c10::intrusive_ptr<c10d::Backend>& backend, int64_t r, const at::Device device,
              const std::string& scratch, RankResult& out) {
  RankRun run(c, f, id, host, r, device, scratch, out);
  run.load(backend);
  run.gather();
  run.forward_backward();
  run.state_dict();
  run.cast_guard();
}

}  // namespace
}  // namespace gradscope::fsdp_ranks

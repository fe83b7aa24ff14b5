// kind = "fsdp": a LoRA MLP (gate, up, down QuantLinear modules) sharded over c10d the way
// FSDP shards it (FSDP1 flat parameters or FSDP2 per-parameter dim-0 shards), world_size
// ranks: one process each under torchrun, else threads of this process, each with its own
// process group: ProcessGroupGloo on the CPU, ProcessGroupNCCL with one GPU per rank on CUDA
// (docs/distributed.md). Each rank
// all-gathers, runs forward and backward on its slice of the tokens, reduce-scatters the adapter
// gradients and releases the full parameters. Checks: the gathered packed words bit for bit on
// every rank; the summed adapter gradients against the unsharded run and the fp64 reference (ratio
// rule); a state dict saved from the shards and reloaded, bit for bit, with words whose float view
// is a NaN or a subnormal; the cast guard refusing a shard that was numerically cast.
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

namespace gradscope {
namespace {

namespace tb = lora_testbed;
using report::SpecValue;

// Words whose fp32, fp16 or bf16 views are NaNs with payloads, signalling NaNs, subnormals
// and negative zero: a cast or a canonicalising copy changes them, a byte copy does not.
constexpr uint32_t kSpecialWords[] = {0x7fc00001u, 0xff800001u, 0x00000001u, 0x807fffffu,
                                      0x7f817c01u, 0x00010001u, 0xffff7fffu, 0x80008000u};

// Plants the special words in the first row of qweight (prod's and base's copies) and
// re-derives the reference weight: any 32-bit word is a valid set of codes.
void plant_special_words(tb::Projection& p) {
  const int64_t n = std::min<int64_t>(p.prod.base.qweight.size(1), std::size(kSpecialWords));
  for (auto* w : {&p.prod.base, &p.base.base}) {
    auto row = w->qweight[0];
    for (int64_t i = 0; i < n; ++i) row[i].fill_(static_cast<int32_t>(kSpecialWords[i]));
  }
  p.ref.weight_t = reference::dequantize(bridge::to_reference(p.prod.base));
}

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
};

// What one rank reports back.
struct RankResult {
  std::vector<report::Check> checks;
  std::map<std::string, tb::AdapterGrads>
      adapter_grads;  // by projection, summed over ranks (rank 0)
};

const char* kNames[] = {"gate_proj", "up_proj", "down_proj"};

// What the ranks read of the case, on the host. The case's tensors live on the main thread's
// device (GPU 0 on CUDA): a rank reading them there would queue its copies on GPU 0's
// default stream, which rank 0's collectives hold (wait() makes that stream wait for
// them), so rank 1 could block behind a collective that needs rank 1 and the group would
// hang in its first reduce-scatter.
struct HostCase {
  std::vector<GptqWeight> base;
  std::vector<at::Tensor> lora_A, lora_B;
  at::Tensor x2, dy2;  // [tokens, hidden]
  HostCase(const std::vector<tb::Projection>& p, const at::Tensor& x2_, const at::Tensor& dy2_)
      : x2(x2_.cpu()), dy2(dy2_.cpu()) {
    for (const auto& proj : p) {
      base.push_back(proj.prod.base.to(at::kCPU));
      lora_A.push_back(proj.prod.lora_A.detach().cpu());
      lora_B.push_back(proj.prod.lora_B.detach().cpu());
    }
  }
};

at::Device device_of(const tb::Config& c, int64_t gpu);
// One rank's part of the case: gather, forward and backward on its slice, reduce-scatter,
// the state dict and the cast guard; its checks and (rank 0) the summed gradients in `out`.
void run_rank(const tb::Config& c, const FsdpConfig& f, const std::string& id, const HostCase& host,
              const c10::intrusive_ptr<c10d::Backend>& backend, int64_t r, const at::Device device,
              const std::string& scratch, RankResult& out);

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

at::Device device_of(const tb::Config& c, int64_t gpu) {
  return c.device.is_cuda() ? at::Device(at::kCUDA, static_cast<int8_t>(gpu))
                            : at::Device(at::kCPU);
}

void run_rank(const tb::Config& c, const FsdpConfig& f, const std::string& id, const HostCase& host,
              const c10::intrusive_ptr<c10d::Backend>& backend, int64_t r, const at::Device device,
              const std::string& scratch, RankResult& out) {
  const std::string where = id + "/rank" + std::to_string(r) + "/";

  QuantLinearOptions qo;
  qo.storage = f.float_view() ? PackedStorage::kFloatParameters : PackedStorage::kInt32Buffers;
  if (f.float_view()) qo.view_dtype = dtype_from_name(f.storage);
  qo.rank = c.rank;
  qo.scaling = c.scaling();
  qo.adapter_dtype = c.adapter_dtype;
  std::vector<QuantLinear> modules;
  std::vector<at::Tensor> frozen, adapters, frozen_before;
  std::vector<std::string> frozen_names, adapter_names;
  // Module j's adapters bit for bit against the case's, under `stage` (loaded, gathered).
  const auto check_adapters = [&](size_t j, const std::string& stage, const std::string& compared) {
    const std::string path = where + stage + "/" + kNames[j] + "/";
    out.checks.push_back(compare_exact(path + "lora_A", compared, modules[j]->lora_A.detach().cpu(),
                                       host.lora_A[j].to(at::kDouble)));
    out.checks.push_back(compare_exact(path + "lora_B", compared, modules[j]->lora_B.detach().cpu(),
                                       host.lora_B[j].to(at::kDouble)));
  };
  for (size_t j = 0; j < host.base.size(); ++j) {
    modules.emplace_back(host.base[j], at::Tensor(), qo);
    auto& m = modules.back();
    // Built on the host from the packed tensors. Buffers (int32 storage) stay whole on
    // every rank, as FSDP leaves buffers unsharded; parameters reach the device only as
    // this rank's shards (below), never whole.
    if (!f.float_view()) m->to(device);
    {
      const at::NoGradGuard no_grad;
      m->lora_A.copy_(host.lora_A[j]);  // from the host, as a rank loads a state dict
      m->lora_B.copy_(host.lora_B[j]);
    }
    // The adapters as loaded, before any collective: with the check after the all-gather
    // below, a wrong copy and a failed gather tell themselves apart.
    check_adapters(j, "loaded", "as loaded vs the case's");
    for (const auto& item : m->named_parameters()) {
      if (item.key() == "lora_A" || item.key() == "lora_B") {
        adapters.push_back(item.value());
        adapter_names.push_back(std::string(kNames[j]) + "." + item.key());
      } else {
        frozen.push_back(item.value());
        frozen_before.push_back(item.value().detach().clone());
        frozen_names.push_back(std::string(kNames[j]) + "." + item.key());
      }
    }
  }
  std::unique_ptr<ShardedParameters> frozen_shards;
  if (!frozen.empty()) {
    frozen_shards = std::make_unique<ShardedParameters>(frozen, f.strategy, backend, device);
  }
  ShardedParameters adapter_shards(adapters, f.strategy, backend, device);

  if (frozen_shards) frozen_shards->gather();
  adapter_shards.gather();
  for (size_t j = 0; j < modules.size(); ++j) {
    const auto words = modules[j]->packed();
    const auto& original = host.base[j];
    const std::string path = where + "gathered/" + kNames[j] + "/gptq/";
    out.checks.push_back(compare_exact(path + "qweight", "after all-gather vs before sharding",
                                       words.qweight, original.qweight.to(at::kLong)));
    out.checks.push_back(compare_exact(path + "qzeros", "after all-gather vs before sharding",
                                       words.qzeros, original.qzeros.to(at::kLong)));
    out.checks.push_back(compare_exact(path + "scales", "after all-gather vs before sharding",
                                       words.scales, original.scales.to(at::kDouble)));
    check_adapters(j, "gathered", "after all-gather vs before sharding");
  }
  // This rank's slice of the tokens; the loss is a sum, so the gradients add over ranks.
  const int64_t slice = host.x2.size(0) / f.world_size;
  const auto projection = [&](size_t j) {
    return LoraProjection{modules[j]->packed(), at::Tensor(), modules[j]->lora_A,
                          modules[j]->lora_B, c.scaling()};
  };
  const auto slice_of = [&](const at::Tensor& t) {
    return t.narrow(0, r * slice, slice).to(device);
  };
  const auto y = lora_mlp(slice_of(host.x2), projection(0), projection(1), projection(2));
  y.backward(slice_of(host.dy2));
  std::vector<at::Tensor> grads;
  for (const auto& a : adapters) grads.push_back(a.grad());
  const auto grad_shards = adapter_shards.reduce_scatter(grads);
  adapter_shards.release();
  if (frozen_shards) frozen_shards->release();
  const auto summed = adapter_shards.gather_copy(grad_shards);  // in the order of `adapters`
  if (r == 0) {
    std::map<std::string, at::Tensor> by_name;
    for (size_t i = 0; i < summed.size(); ++i) by_name[adapter_names[i]] = summed[i];
    for (const char* name : kNames) {
      out.adapter_grads[name] = {by_name.at(std::string(name) + ".lora_A"),
                                 by_name.at(std::string(name) + ".lora_B")};
    }
  }

  // A state dict from the shards (every rank gathers; rank 0 writes and reloads it).
  const auto full = frozen_shards ? frozen_shards->gather_copy(frozen_shards->shards())
                                  : std::vector<at::Tensor>{};
  if (r == 0 && !full.empty()) {
    std::vector<safetensors::OutputTensor> tensors;
    for (size_t i = 0; i < full.size(); ++i) {
      tensors.push_back(to_safetensors(frozen_names[i], full[i]));
    }
    const std::string path = scratch + "/state_dict.safetensors";
    safetensors::write_file(path, tensors, {});
    const safetensors::File file(path);
    for (size_t i = 0; i < full.size(); ++i) {
      out.checks.push_back(compare_bits(id + "/state_dict/" + frozen_names[i],
                                        "reloaded from a state dict of the shards vs before "
                                        "sharding",
                                        from_safetensors(file, *file.find(frozen_names[i])),
                                        frozen_before[i]));
    }
  }

  // The cast guard: a numeric round trip of one shard through another float dtype (a
  // mixed-precision policy that casts) must be refused by name, not computed on.
  if (frozen_shards) {
    auto& shard = frozen_shards->shards().front();
    const auto other = shard.scalar_type() == at::kHalf ? at::kBFloat16 : at::kHalf;
    const auto saved = shard.clone();
    shard.copy_(shard.to(other).to(shard.scalar_type()));
    frozen_shards->gather();
    std::string message;
    try {
      for (auto& m : modules) m->check_packed_intact();
    } catch (const c10::Error& e) {
      message = e.what_without_backtrace();
    }
    // Refused, and by the name of a packed tensor.
    const bool named = message.find("qweight") != std::string::npos ||
                       message.find("qzeros") != std::string::npos ||
                       message.find("scales") != std::string::npos ||
                       message.find("g_idx") != std::string::npos;
    out.checks.push_back(expect_rejection(
        where + "cast_guard", "a numerically cast shard refused by name", named,
        message.empty() ? "the words were cast and nothing noticed" : "message: " + message));
    shard.copy_(saved);
    frozen_shards->release();
  }
}

class FsdpTestbed final : public Testbed {
 public:
  explicit FsdpTestbed(const CaseContext& context)
      : context_(context),
        c_(context.spec),
        f_(context.spec),
        hidden_(context.spec.get_int("hidden")),
        inter_(context.spec.get_int("intermediate")) {}

  void generate() override {
    for (const auto& [name, in, out] :
         {std::tuple{"gate_proj", hidden_, inter_}, std::tuple{"up_proj", hidden_, inter_},
          std::tuple{"down_proj", inter_, hidden_}}) {
      p_.push_back(tb::make_projection(c_, name, in, out));
      plant_special_words(p_.back());
    }
    x_ = tb::make_activation(c_, "x", hidden_, false);
    dy_ = tb::make_output_grad(c_, "dy", hidden_);
    host_.emplace(p_, x_.prod.reshape({-1, hidden_}), dy_.prod.reshape({-1, hidden_}));
  }

  // prod: the sharded run, every rank's part (threads, or this process's rank under torchrun).
  void prod() override {
    const auto& options = context_.options;
#ifdef GRADSCOPE_WITH_CUDA
    // One GPU per rank: GPU r for thread r, GPU LOCAL_RANK for a process.
    const int64_t gpus_needed = options.ranks ? options.ranks->local_rank() + 1 : f_.world_size;
    if (c_.device.is_cuda() && c10::cuda::device_count() < gpus_needed) {
      throw InputError(context_.id + ": world_size " + std::to_string(f_.world_size) +
                       " needs one GPU per rank (NCCL)" +
                       (options.ranks
                            ? ", GPU LOCAL_RANK = " + std::to_string(options.ranks->local_rank())
                            : std::string()) +
                       "; this machine has " + std::to_string(c10::cuda::device_count()));
    }
#endif
    ranks_ = options.ranks ? run_as_process(c_, f_, context_.id, *host_, options)
                           : run_as_threads(c_, f_, context_.id, *host_);
  }

  // base: prod's fused op unsharded, on all tokens. The sharded sum adds per-rank partial
  // sums in another order, no more.
  void base() override {
    const auto y = lora_mlp(x_.prod.reshape({-1, hidden_}), p_[0].prod, p_[1].prod, p_[2].prod);
    unsharded_ = tb::backward({y}, {dy_.prod.reshape({-1, hidden_})}, at::Tensor(),
                              tb::copies_of({&p_[0], &p_[1], &p_[2]}, tb::Role::kProd));
  }

  void ref() override {
    tape_ = reference::mlp_tape(x_.ref, p_[0].ref, p_[1].ref, none_);
    ref_ = reference::mlp_backward(tape_, x_.ref, dy_.ref, p_[0].ref, p_[1].ref, p_[2].ref, none_,
                                   none_);
  }

  void floor() override {
    noise_.emplace(tb::precision(c_));
    const auto y = reference::lora_forward(reference::swiglu(tape_.e, tape_.g), p_[2].ref, none_);
    floor_ =
        noise_->mlp(tape_, x_.ref, dy_.ref, p_[0].ref, p_[1].ref, p_[2].ref, none_, none_, y, ref_);
  }

  void verify(CaseResult& out) override {
    if (ranks_.empty()) return;  // a process other than rank 0: rank 0 reports the case
    for (auto& rank : ranks_) {
      for (auto& check : rank.checks) out.checks.push_back(std::move(check));
    }
    tb::Checks checks(c_, context_.id + "/layer0/mlp/", context_.options.keep_tensors, *noise_);
    note_partial_overflow(checks);
    const reference::ProjectionGrads* refs[] = {&ref_.gate, &ref_.up, &ref_.down};
    const reference::ProjectionGradsNoise* noises[] = {&floor_.gate, &floor_.up, &floor_.down};
    for (size_t j = 0; j < p_.size(); ++j) {
      checks.add_adapter_grads(p_[j], ranks_[0].adapter_grads.at(p_[j].name),
                               unsharded_.of(p_[j].name), *refs[j], *noises[j]);
    }
    for (auto& check : checks.take()) out.checks.push_back(std::move(check));
  }

 private:
  // Each rank's partial gradient is held in the adapter dtype before the ranks sum them, by a
  // careful implementation too: one beyond its range makes an overflow the case's.
  void note_partial_overflow(tb::Checks& checks) const {
    if (c_.adapter_dtype == at::kFloat) return;
    const int64_t slice = c_.tokens() / f_.world_size;
    const double max = tb::format_of(c_.adapter_dtype).max;
    for (int64_t r = 0; r < f_.world_size; ++r) {
      const reference::Matrix xs = x_.ref.middleRows(r * slice, slice);
      const reference::Matrix dys = dy_.ref.middleRows(r * slice, slice);
      const auto part =
          reference::mlp_backward(xs, dys, p_[0].ref, p_[1].ref, p_[2].ref, none_, none_);
      const reference::ProjectionGrads* parts[] = {&part.gate, &part.up, &part.down};
      for (size_t j = 0; j < 3; ++j) {
        const double m =
            std::max(parts[j]->dA.cwiseAbs().maxCoeff(), parts[j]->dB.cwiseAbs().maxCoeff());
        if (m > max) {
          checks.note_model_overflow("rank " + std::to_string(r) + "'s partial gradient of " +
                                         kNames[j] + " reaches " + report::format_number(m) +
                                         " > " + bridge::dtype_name(c_.adapter_dtype) + " max " +
                                         report::format_number(max),
                                     bridge::dtype_name(c_.adapter_dtype));
        }
      }
    }
  }

  const CaseContext context_;
  const tb::Config c_;
  const FsdpConfig f_;
  const int64_t hidden_, inter_;
  const reference::Dropout none_;
  std::vector<tb::Projection> p_;
  tb::Activation x_, dy_;
  std::optional<HostCase> host_;
  std::vector<RankResult> ranks_;
  tb::Gradients unsharded_;
  reference::MlpTape tape_;
  reference::MlpGrads ref_;
  std::optional<reference::RoundingNoise> noise_;
  reference::MlpNoise floor_;
};

}  // namespace

KindDecl fsdp_kind() {
  KindDecl k;
  k.name = "fsdp";
  k.fields = [] {
    const auto s = [](const char* v) { return SpecValue(std::string(v)); };
    std::vector<FieldSpec> f = {
        FieldSpec("hidden", FieldType::kInt, int64_t{256}, "hidden size").in_range(1, 1 << 16),
        FieldSpec("intermediate", FieldType::kInt, int64_t{512}, "MLP intermediate size")
            .in_range(1, 1 << 17),
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
    for (auto& x : tb::fields()) f.push_back(std::move(x));
    return f;
  }();
  k.case_id = [](const CaseSpec& s) {
    const FsdpConfig f(s);
    return "fsdp." + s.get_string("dtype") + ".h" + std::to_string(s.get_int("hidden")) + "i" +
           std::to_string(s.get_int("intermediate")) + ".w" + std::to_string(f.world_size) + "." +
           s.get_string("sharding") + "." + f.storage + tb::Config(s).id_suffix();
  };
  k.processes_needed = [](const CaseSpec& s) { return s.get_int("world_size"); };
  // The MLP's reference, as in kind mlp.
  k.host_bytes_at_least = [](const CaseSpec& s) {
    const int64_t hidden = s.get_int("hidden"), inter = s.get_int("intermediate");
    return 2 * tb::reference_projection_bytes(s, hidden, inter) +
           tb::reference_projection_bytes(s, inter, hidden);
  };
  k.validate = [](const CaseSpec& s) {
    tb::validate(s);
    const FsdpConfig f(s);
    const tb::Config c(s);
    if (c.tokens() % f.world_size != 0) {
      throw_field_error(s, "world_size",
                        "must divide the " + std::to_string(c.tokens()) +
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
    if (s.get_float("dropout") != 0.0) {
      throw_field_error(s, "dropout", "must be 0 for kind fsdp (dropout is checked per op)");
    }
    if (!s.get_string("checkpoint").empty()) {
      throw_field_error(s, "checkpoint", "must be empty for kind fsdp");
    }
    const int64_t hidden = s.get_int("hidden"), inter = s.get_int("intermediate");
    validate_gptq_shape(s, hidden, inter, "hidden", "intermediate");
    validate_gptq_shape(s, inter, hidden, "intermediate", "hidden");
  };
  k.testbed = [](const CaseContext& c) { return std::make_unique<FsdpTestbed>(c); };
  return k;
}

}  // namespace gradscope

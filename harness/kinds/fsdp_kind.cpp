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

#include "harness/common/dtypes.h"
#include "harness/common/input_error.h"
#include "harness/common/llama_projections.h"
#include "harness/common/tensor_bridge.h"
#include "harness/distributed/process_ranks.h"
#include "harness/kinds/field_draws.h"
#include "harness/kinds/fsdp_ranks.h"
#include "harness/kinds/kind_decls.h"
#include "harness/kinds/lora_testbed.h"
#include "harness/verdict/compare.h"

namespace gradscope {
namespace {

namespace tb = lora_testbed;
using namespace fsdp_ranks;

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
    for (const auto& p : p_) {
      checks.add_adapter_grads(p, ranks_[0].adapter_grads.at(p.name), unsharded_.of(p.name),
                               mlp_member(ref_, p.name), mlp_member(floor_, p.name));
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
      for (const auto& proj : p_) {
        const auto& g = mlp_member(part, proj.name);
        const double m = std::max(g.dA.cwiseAbs().maxCoeff(), g.dB.cwiseAbs().maxCoeff());
        if (m > max) {
          checks.note_model_overflow("rank " + std::to_string(r) + "'s partial gradient of " +
                                         proj.name + " reaches " + report::format_number(m) +
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
    std::vector<FieldSpec> f = {
        FieldSpec("hidden", FieldType::kInt, int64_t{256}, "hidden size").in_range(1, 1 << 16),
        FieldSpec("intermediate", FieldType::kInt, int64_t{512}, "MLP intermediate size")
            .in_range(1, 1 << 17),
    };
    for (auto& x : FsdpConfig::fields()) f.push_back(std::move(x));
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
    const tb::Config c(s);
    if (tb::has_tensors(s)) {
      throw_field_error(s, "tensors", "must be empty for kind fsdp (its words are planted)");
    }
    FsdpConfig::validate(s, c.tokens());
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
  k.sample = [](CaseDraw& d) {
    const int64_t world = d.pick<int64_t>({1, 2, 4});
    d.set("world_size", world);
    d.set("sharding", d.chance(0.5) ? "flat" : "per_param");
    d.set("storage", d.pick<std::string>({"int32", "fp32", "bf16"}));
    // Multiples of 32 for now: shards that need padding are not drawn (docs/coverage.md).
    d.set("hidden", 32 * d.between(2, 8));
    d.set("intermediate", 32 * d.between(2, 12));
    d.set("rank", d.pick<int64_t>({4, 8, 16}));
    d.set("alpha", d.pick<double>({8.0, 16.0, 32.0}));
    d.set("adapter_dtype", d.chance(0.7) ? "fp32" : field_draws::float_dtype(d));
    d.set("batch", 4);
    d.set("seq", d.pick<int64_t>({4, 8, 16}));
    d.set("profile", d.chance(0.5) ? "realistic" : "unit");
    field_draws::gptq(d);
  };
  return k;
}

}  // namespace gradscope

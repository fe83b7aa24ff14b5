// kind = "training": the causal LM of causal_lm_training.h trained for N AdamW steps from
// identical adapters and batches by prod, the unfused baseline and the fp64 reference.
//
// Gated at every step: each token's loss of prod and the baseline evaluated on the
// reference's adapters of that step, under the ratio rule. The free-running curves are
// reported, not gated token by token: a step-k loss of a free-running run carries the whole
// parameter drift of k steps, one random direction shared by every token, so its maximum
// over tokens does not settle and two correct runs can differ by more than 2x at some step.
// Evaluated on the reference's adapters, the errors are this step's rounding, token by
// token, and the ratio rule is as sound as for any output. The state a step hands to the
// next is gated exactly: the packed base weights must come back bit for bit after training,
// and a backward must leave the adapters as it found them (docs/verification.md).
#include <ATen/ATen.h>

#include <algorithm>
#include <optional>
#include <utility>

#include "gradscope/gptq_format.h"
#include "harness/common/tensor_bridge.h"
#include "harness/kinds/causal_lm_training.h"
#include "harness/kinds/field_draws.h"
#include "harness/kinds/kind_decls.h"
#include "harness/verdict/compare.h"

namespace gradscope {
namespace {

namespace tb = lora_testbed;
namespace ds = decoder_stack;
using namespace causal_lm_training;

class TrainingTestbed final : public Testbed {
 public:
  explicit TrainingTestbed(const CaseContext& context)
      : context_(context), c_(context.spec), dims_(context.spec), t_(context.spec) {}

  // prod and base evaluate their gated losses on the reference's adapters of each step; the
  // floor of those losses is computed with them.
  PhasePlan plan() const override { return {true, false, true}; }

  void generate() override {
    stack_ = ds::make_stack(c_, dims_);
    batches_ = make_batches(c_, t_);
    auto model = make_model(c_, dims_, t_, stack_);
    frozen_ = std::move(model.frozen);
    ref_model_ = std::move(model.ref);
    // Prod's packed words as generated: it must hand them back untouched.
    for (size_t i = 0; i < stack_.size(); ++i) {
      for (const auto& p : stack_[i].projections) {
        const auto& w = p.prod.base;
        packed_before_[adapter_path(i, p.name, "")] = {
            w.qweight.clone(), w.qzeros.clone(), w.scales.clone(), {}};
      }
    }
    for (const auto role : {tb::Role::kProd, tb::Role::kBase}) {
      auto& layers = role == tb::Role::kProd ? prod_layers_ : base_layers_;
      for (const auto& L : stack_) {
        layers.push_back(ds::device_layer(c_, dims_, L, role, ref_model_.shape.position_offset));
      }
    }
  }

  void ref() override {
    noise_.emplace(tb::precision(c_));
    ref_ = train_reference(ref_model_, batches_, t_, c_, snapshots_, *noise_, floors_);
  }

  void prod() override {
    prod_ =
        train(frozen_, prod_layers_, batches_, snapshots_, t_,
              {tb::Role::kProd, impl::layer_ops(impl::Ops(context_.options.impl), c_.lora_args())});
  }
  void base() override {
    base_ = train(frozen_, base_layers_, batches_, snapshots_, t_, {tb::Role::kBase, {}});
  }

  void verify(CaseResult& out) override {
    const std::string& id = context_.id;
    const bool keep = context_.options.keep_tensors;
    report::LossCurve curve;
    curve.prod = prod_.mean_loss, curve.base = base_.mean_loss, curve.ref = ref_.mean_loss;
    curve.grad_norm_prod = prod_.grad_norm, curve.grad_norm_base = base_.grad_norm;
    curve.grad_norm_ref = ref_.grad_norm;
    for (int64_t step = 0; step < t_.steps; ++step) {
      tb::Checks losses(c_, id + "/", keep, *noise_);
      const auto& floor = floors_[step];
      double sigma = 0;
      for (const auto& e : floor.scores) sigma = std::max(sigma, e.sigma);
      out.metrics.emplace_back("step" + std::to_string(step) + ".score_sigma", sigma);
      for (size_t i = 0; i < floor.scores.size(); ++i) {  // the first layer past the model
        const auto why = ds::attention_beyond_model(
            floor.scores[i], "step " + std::to_string(step) + ": layer " + std::to_string(i), c_);
        if (!why.empty()) {
          losses.note_not_judged(why);
          break;
        }
      }
      losses.add_as(
          "step" + std::to_string(step) + "/loss/token_loss",
          {prod_.forced_losses[step], base_.forced_losses[step],
           bridge::to_matrix(ref_.forced_losses[step].view({-1, 1})), floor.loss_variance},
          {c_.tokens()}, Expected{at::kFloat, at::kCPU}, ErrorStatistic::kMeanAbs);
      auto check = std::move(losses.take().front());
      if (!check.passed && !check.out_of_range && !curve.divergence_step) {
        curve.divergence_step = step;  // a step not judged is no divergence
      }
      out.checks.push_back(std::move(check));
    }
    const auto named = [](const std::vector<DecoderLayer>& layers) {
      Adapters a;
      for (auto& [path, t] : adapters(layers)) a[path] = t;
      return a;
    };
    const auto trained = std::map<std::string, Adapters>{{"prod", named(prod_layers_)},
                                                         {"base", named(base_layers_)}};
    for (size_t i = 0; i < stack_.size(); ++i) {
      for (const auto& p : stack_[i].projections) {
        const std::string where = adapter_path(i, p.name, "");
        const auto& r = member(ref_model_.layers[i], p.name);
        // The trained adapters are reported, not gated: free-running AdamW divides by the
        // second moment, so elements whose gradient is near zero carry most of the drift and
        // the maximum over elements is a handful of samples.
        for (const auto& [impl, adapters] : trained) {
          double max_abs = 0, sum_abs = 0, count = 0;
          for (const auto& [part, ref] :
               {std::pair{"lora_A", &r.lora_A}, std::pair{"lora_B", &r.lora_B}}) {
            const auto diff =
                (adapters.at(where + part).detach().cpu().to(at::kDouble) - bridge::to_tensor(*ref))
                    .abs();
            max_abs = std::max(max_abs, diff.max().item<double>());
            sum_abs += diff.sum().item<double>();
            count += static_cast<double>(diff.numel());
          }
          out.metrics.emplace_back("trained/" + where + "max_abs." + impl, max_abs);
          out.metrics.emplace_back("trained/" + where + "mean_abs." + impl, sum_abs / count);
        }
        // A backward must leave its adapters as it found them; the optimizer moves them.
        for (const char* part : {"lora_A", "lora_B"}) {
          out.checks.push_back(compare_exact(id + "/unchanged_by_backward/" + where + part,
                                             "after a backward vs before its forward",
                                             prod_.after_backward.at(where + part),
                                             prod_.before_forward.at(where + part), {}, keep));
        }
        const auto& before = packed_before_.at(where);
        for (const auto& [name, now, was] :
             {std::tuple{"qweight", &p.prod.base.qweight, &before.qweight},
              std::tuple{"qzeros", &p.prod.base.qzeros, &before.qzeros},
              std::tuple{"scales", &p.prod.base.scales, &before.scales}}) {
          const bool words = std::string(name) != "scales";
          out.checks.push_back(compare_exact(
              id + "/frozen/" + where + "gptq/" + name, "after training vs as generated",
              words ? as_packed_words(*now, name).cpu() : now->cpu(),
              words ? as_packed_words(*was, name).cpu().to(at::kLong) : was->cpu().to(at::kDouble),
              {}, keep));
        }
      }
    }
    out.metrics.emplace_back("loss.first", ref_.mean_loss.front());
    out.metrics.emplace_back("loss.last", ref_.mean_loss.back());
    out.loss_curve = std::move(curve);
  }

 private:
  const CaseContext context_;
  const tb::Config c_;
  const ds::Dims dims_;
  const TrainingConfig t_;
  std::vector<ds::StackLayer> stack_;
  std::map<std::string, GptqWeight> packed_before_;  // by projection path
  std::vector<Batch> batches_;
  FrozenModel frozen_;
  reference::CausalLm ref_model_;
  std::vector<DecoderLayer> prod_layers_, base_layers_;
  std::optional<reference::RoundingNoise> noise_;
  AdapterSnapshots snapshots_;
  std::vector<StepFloor> floors_;
  Trajectory ref_, prod_, base_;
};

}  // namespace

KindDecl training_kind() {
  KindDecl k;
  k.name = "training";
  k.fields = ds::fields();
  for (auto& f : TrainingConfig::fields()) k.fields.push_back(std::move(f));
  for (auto& f : tb::fields()) k.fields.push_back(std::move(f));
  k.case_id = [](const CaseSpec& s) {
    const TrainingConfig t(s);
    return "training." + s.get_string("dtype") + "." + ds::Dims(s).id_part() + ".V" +
           std::to_string(t.vocab) + ".n" + std::to_string(t.steps) + tb::Config(s).id_suffix();
  };
  k.prod_ops = {"lora_qkv", "lora_w", "lora_mlp"};
  // The stack, the embedding and LM head in fp64, and one step's logits.
  k.host_bytes_at_least = [](const CaseSpec& s) {
    const double vocab = double(s.get_int("vocab")), hidden = double(s.get_int("hidden"));
    return ds::stack_reference_bytes(s) + 8.0 * vocab * (2 * hidden + double(tb::case_tokens(s)));
  };
  k.validate = [](const CaseSpec& s) {
    ds::validate(s, "training");
    TrainingConfig::validate(s);
    if (tb::has_tensors(s)) {
      throw_field_error(s, "tensors", "must be empty for kind training (its batches are seeded)");
    }
    if (!s.get_string("checkpoint").empty()) {
      throw_field_error(s, "checkpoint",
                        "must be empty for kind training (the embedding and LM head are seeded)");
    }
  };
  k.testbed = [](const CaseContext& c) { return std::make_unique<TrainingTestbed>(c); };
  k.sample = [](CaseDraw& d) {
    field_draws::decoder_shape(d, field_draws::gptq(d));
    d.set("layers", 1);
    d.set("vocab", d.pick<int64_t>({16, 32, 64}));
    d.set("steps", d.between(2, 4));
    d.set("lr", d.pick<double>({1e-3, 5e-3}));
    field_draws::lora(d, false, false, 48);
    field_draws::positions(d);
    field_draws::norm_and_rope(d);
  };
  return k;
}

}  // namespace gradscope

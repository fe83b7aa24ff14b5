// kind = "training": a small causal LM (frozen embedding, a stack of GPTQ decoder layers with
// LoRA on all seven projections, frozen final RMSNorm and LM head, next-token cross-entropy)
// trained for N AdamW steps from identical adapters and batches by prod, the unfused
// baseline and the fp64 reference, each with its own optimizer.
//
// Gated at every step: each token's loss of prod and the baseline evaluated on the
// reference's adapters of that step, under the ratio rule. The free-running curves are
// reported, not gated token by token: a step-k loss of a free-running run carries the whole
// parameter drift of k steps, one random direction shared by every token, so its maximum
// over tokens does not settle and two correct runs differ by more than 2x at some step (a
// correct fp32 case failed at step 14 of 20 when gated that way). Evaluated on the
// reference's adapters, the errors are this step's rounding, token by token, and the
// ratio rule is as sound as for any output. The state a step hands to the next is gated
// exactly: the packed base weights must come back bit for bit after training, and a
// backward must leave the adapters as it found them. Faults that persist across steps (a
// backward that writes into the frozen weights) also show in the gated step-k losses,
// which run on prod's own frozen state.
#include <ATen/ATen.h>
#include <torch/optim/adamw.h>

#include <algorithm>
#include <cmath>

#include "gradscope/decoder_layer.h"
#include "gradscope/gptq_format.h"
#include "harness/baseline/aten_baseline.h"
#include "harness/common/tensor_bridge.h"
#include "harness/generate/seeded_streams.h"
#include "harness/runners/decoder_stack.h"
#include "harness/runners/lora_testbed.h"
#include "harness/runners/runner_factories.h"
#include "harness/verdict/compare.h"
#include "reference/causal_lm_reference.h"

namespace gradscope {
namespace {

namespace tb = lora_testbed;
namespace ds = decoder_stack;

struct TrainingConfig {
  int64_t vocab, steps, warmup;
  double lr;
  reference::AdamWConfig adamw;

  explicit TrainingConfig(const CaseSpec& s)
      : vocab(s.get_int("vocab")),
        steps(s.get_int("steps")),
        warmup(s.get_int("warmup")),
        lr(s.get_float("lr")),
        adamw{s.get_float("beta1"), s.get_float("beta2"), s.get_float("adam_eps"),
              s.get_float("weight_decay")} {}

  // Linear warmup over the first `warmup` steps, then constant.
  double lr_at(int64_t step) const {
    return warmup > 0 ? lr * std::min(1.0, double(step + 1) / double(warmup)) : lr;
  }
};

// One step's token sequences: a seeded Markov chain over the vocabulary (the next token
// is a fixed successor of the current one three times in four, else uniform), so there
// is something to learn and the loss falls.
struct Batch {
  at::Tensor tokens;   // int64 [batch, seq], case device
  at::Tensor targets;  // int64 [batch * seq], the following tokens
  std::vector<int64_t> ref_tokens, ref_targets;
};

Batch make_batch(const tb::Config& c, const TrainingConfig& t, const at::Tensor& successor,
                 int64_t step) {
  const SeededStream stream(c.seed, "training.step" + std::to_string(step) + ".tokens");
  const auto* next = successor.data_ptr<int64_t>();
  const int64_t width = c.seq + 1;
  std::vector<int64_t> chain(c.batch * width);
  for (int64_t b = 0; b < c.batch; ++b) {
    for (int64_t i = 0; i < width; ++i) {
      const auto words = stream.block(b * width + i);
      const int64_t uniform = words[1] % static_cast<uint64_t>(t.vocab);
      const bool follow = i > 0 && words[0] < 0xC0000000u;  // probability 3/4
      chain[b * width + i] = follow ? next[chain[b * width + i - 1]] : uniform;
    }
  }
  Batch batch;
  for (int64_t b = 0; b < c.batch; ++b) {
    for (int64_t i = 0; i < c.seq; ++i) {
      batch.ref_tokens.push_back(chain[b * width + i]);
      batch.ref_targets.push_back(chain[b * width + i + 1]);
    }
  }
  const auto as_tensor = [&](const std::vector<int64_t>& v) {
    return at::tensor(v, at::kLong).to(c.device);
  };
  batch.tokens = as_tensor(batch.ref_tokens).view({c.batch, c.seq});
  batch.targets = as_tensor(batch.ref_targets);
  return batch;
}

// The frozen parts of the model around the layers, as prod and the baseline hold them.
struct FrozenModel {
  at::Tensor embedding, final_norm, lm_head;  // case dtype, device
};

// Which layers a pass runs: prod's, whose LoRA ops are the implementation under test's
// operators, or the baseline's.
struct LayerPass {
  tb::Impl impl;
  LayerLoraOps prod_ops;  // prod only
};

// Each token's loss [batch * seq] in fp32. The embedding, final norm, LM head and loss are
// not under test: prod and the baseline share this code and differ only in the layers.
at::Tensor token_losses(const FrozenModel& m, const std::vector<DecoderLayer>& layers,
                        const Batch& batch, const LayerPass& pass) {
  auto h = m.embedding.index_select(0, batch.tokens.flatten())
               .view({batch.tokens.size(0), batch.tokens.size(1), -1});
  for (const auto& layer : layers) {
    h = pass.impl == tb::Impl::kProd ? decoder_layer(h, layer, pass.prod_ops)
                                     : baseline::decoder_layer(h, layer);
  }
  const auto logits = at::matmul(rms_norm(h, m.final_norm, ds::kNormEps), m.lm_head.t());
  return at::cross_entropy_loss(logits.reshape({-1, m.lm_head.size(0)}).to(at::kFloat),
                                batch.targets, {}, at::Reduction::None);
}

struct Trajectory {
  std::vector<double> mean_loss, grad_norm;  // free-running, per step
  // Each adapter just before a forward and just after its backward (host), from the first
  // step where a backward changed any adapter, else from the last step.
  std::vector<at::Tensor> before_forward, after_backward;
  // Per step, each token's loss [tokens] on the reference's adapters of that step: the gated
  // comparison (host; fp32 for prod and base, fp64 for the reference).
  std::vector<at::Tensor> forced_losses;
};

// The reference's adapters at every step, in the adapter dtype on the case device, in the
// order of adapters(): what prod and the baseline evaluate the gated losses on.
using AdapterSnapshots = std::vector<std::vector<at::Tensor>>;

// Where adapters() puts the lora_A or lora_B of projection `projection` (q, k, v, o, gate, up,
// down) of layer `layer`.
enum class AdapterPart : size_t { kLoraA = 0, kLoraB = 1 };
size_t adapter_slot(size_t layer, size_t projection, AdapterPart part) {
  return 2 * (7 * layer + projection) + static_cast<size_t>(part);
}

std::vector<at::Tensor> adapters(const std::vector<DecoderLayer>& layers) {
  std::vector<at::Tensor> params;
  for (const auto& L : layers) {
    for (const auto* p : {&L.q, &L.k, &L.v, &L.o, &L.gate, &L.up, &L.down}) {
      params.push_back(p->lora_A);
      params.push_back(p->lora_B);
    }
  }
  return params;
}

std::vector<DecoderLayer> with_adapters(std::vector<DecoderLayer> layers,
                                        const std::vector<at::Tensor>& values) {
  size_t i = 0;
  for (auto& L : layers) {
    for (auto* p : {&L.q, &L.k, &L.v, &L.o, &L.gate, &L.up, &L.down}) {
      p->lora_A = values[i++];
      p->lora_B = values[i++];
    }
  }
  return layers;
}

// Trains the adapters in `layers` in place with PyTorch's own AdamW (torch::optim: the
// optimizer is not under test, the gradients feeding it are) and, before each step,
// evaluates the token losses on the reference's adapters of that step.
Trajectory train(const FrozenModel& m, const std::vector<DecoderLayer>& layers,
                 const std::vector<Batch>& batches, const AdapterSnapshots& reference_adapters,
                 const TrainingConfig& t, const LayerPass& pass) {
  const auto params = adapters(layers);
  torch::optim::AdamW optimizer(params, torch::optim::AdamWOptions(t.lr)
                                            .betas({t.adamw.beta1, t.adamw.beta2})
                                            .eps(t.adamw.eps)
                                            .weight_decay(t.adamw.weight_decay));
  Trajectory out;
  bool backward_changed_adapters = false;
  for (int64_t step = 0; step < t.steps; ++step) {
    {
      const at::NoGradGuard no_grad;
      const auto forced = with_adapters(layers, reference_adapters[step]);
      out.forced_losses.push_back(token_losses(m, forced, batches[step], pass).cpu());
    }
    for (auto& group : optimizer.param_groups()) {
      static_cast<torch::optim::AdamWOptions&>(group.options()).lr(t.lr_at(step));
    }
    optimizer.zero_grad();
    std::vector<at::Tensor> before;
    if (!backward_changed_adapters) {
      for (const auto& p : params) before.push_back(p.detach().cpu().clone());
    }
    const auto loss = token_losses(m, layers, batches[step], pass).mean();
    loss.backward();
    if (!backward_changed_adapters) {
      out.before_forward = std::move(before);
      out.after_backward.clear();
      for (size_t i = 0; i < params.size(); ++i) {
        out.after_backward.push_back(params[i].detach().cpu().clone());
        backward_changed_adapters |= !out.after_backward[i].equal(out.before_forward[i]);
      }
    }
    double squares = 0;
    for (const auto& p : params) {
      if (p.grad().defined()) squares += p.grad().to(at::kDouble).pow(2).sum().item<double>();
    }
    out.mean_loss.push_back(loss.item<double>());
    out.grad_norm.push_back(std::sqrt(squares));
    optimizer.step();
  }
  return out;
}

// The fp64 reference's training run: its own forward, backward and AdamW; the trained
// adapters are left in `model`, and each step's adapters, rounded to `adapter_dtype`, are
// appended to `snapshots`.
Trajectory train_reference(reference::CausalLm& model, const std::vector<Batch>& batches,
                           const TrainingConfig& t, const tb::Config& c,
                           AdapterSnapshots& snapshots, reference::RoundingNoise& noise,
                           std::vector<reference::Matrix>& loss_variances) {
  std::vector<reference::Matrix*> params;
  for (auto& L : model.layers) {
    for (auto* p : {&L.q, &L.k, &L.v, &L.o, &L.gate, &L.up, &L.down}) {
      params.push_back(&p->lora_A);
      params.push_back(&p->lora_B);
    }
  }
  std::vector<reference::AdamWState> state(params.size());
  Trajectory out;
  for (int64_t step = 0; step < t.steps; ++step) {
    // Parameters live in the adapter dtype, here as in prod (AdamW's moments stay fp64):
    // the gated losses of prod and the reference are then on identical adapters.
    auto& snapshot = snapshots.emplace_back();
    for (auto* p : params) {
      const auto rounded = bridge::to_tensor(*p).to(c.adapter_dtype);
      snapshot.push_back(rounded.to(c.device));
      *p = bridge::to_matrix(rounded);
    }
    const auto& b = batches[step];
    const auto result = reference::causal_lm_backward(model, b.ref_tokens, b.ref_targets);
    // The floor of this step's gated losses: a careful implementation's rounding noise on
    // exactly these adapters and tokens.
    loss_variances.push_back(noise.token_losses(model, b.ref_tokens, b.ref_targets));
    std::vector<const reference::Matrix*> grads;
    for (const auto& g : result.grads) {
      for (const auto* p : {&g.q, &g.k, &g.v, &g.o, &g.gate, &g.up, &g.down}) {
        grads.push_back(&p->dA);
        grads.push_back(&p->dB);
      }
    }
    double squares = 0;
    for (const auto* g : grads) squares += g->squaredNorm();
    out.forced_losses.push_back(bridge::to_tensor(reference::Matrix(result.losses)).view({-1}));
    out.mean_loss.push_back(result.losses.mean());
    out.grad_norm.push_back(std::sqrt(squares));
    for (size_t i = 0; i < params.size(); ++i) {
      reference::adamw_step(*params[i], *grads[i], state[i], t.lr_at(step), t.adamw);
    }
  }
  return out;
}

class TrainingRunner final : public CaseRunner {
 public:
  std::string kind() const override { return "training"; }

  std::vector<FieldSpec> fields() const override {
    auto f = ds::fields();
    const std::vector<FieldSpec> training = {
        FieldSpec("vocab", FieldType::kInt, int64_t{256}, "vocabulary of the embedding and LM head")
            .in_range(2, 1 << 20),
        FieldSpec("steps", FieldType::kInt, int64_t{20}, "AdamW steps").in_range(1, 100000),
        FieldSpec("lr", FieldType::kFloat, 2e-3, "AdamW learning rate").in_range(1e-12, 10),
        FieldSpec("warmup", FieldType::kInt, int64_t{0},
                  "linear warmup steps (0: constant learning rate)")
            .in_range(0, 100000),
        FieldSpec("beta1", FieldType::kFloat, 0.9, "AdamW beta1, [0, 1)").in_range(0, 1),
        FieldSpec("beta2", FieldType::kFloat, 0.999, "AdamW beta2, [0, 1)").in_range(0, 1),
        FieldSpec("adam_eps", FieldType::kFloat, 1e-8, "AdamW epsilon").in_range(0, 1),
        FieldSpec("weight_decay", FieldType::kFloat, 0.01, "AdamW decoupled weight decay")
            .in_range(0, 1),
    };
    for (const auto& x : training) f.push_back(x);
    for (auto& x : tb::fields()) f.push_back(std::move(x));
    return f;
  }

  std::string case_id(const CaseSpec& s) const override {
    const TrainingConfig t(s);
    return "training." + s.get_string("dtype") + "." + ds::Dims(s).id_part() + ".V" +
           std::to_string(t.vocab) + ".n" + std::to_string(t.steps) + tb::Config(s).id_suffix();
  }

  std::vector<std::string> prod_ops() const override { return {"lora_qkv", "lora_w", "lora_mlp"}; }

  // The stack, the embedding and LM head in fp64, and one step's logits.
  double host_bytes_at_least(const CaseSpec& s) const override {
    const double vocab = double(s.get_int("vocab")), hidden = double(s.get_int("hidden"));
    return ds::stack_reference_bytes(s) + 8.0 * vocab * (2 * hidden + double(tb::case_tokens(s)));
  }

  void validate(const CaseSpec& s) const override {
    ds::validate(s, kind());
    for (const char* beta : {"beta1", "beta2"}) {
      if (s.get_float(beta) >= 1.0) {
        throw_field_error(s, beta,
                          "must be below 1 (the moments would never forget), got " +
                              report::format_spec_value(s.get_float(beta)));
      }
    }
    if (!s.get_string("checkpoint").empty()) {
      throw_field_error(s, "checkpoint",
                        "must be empty for kind training (the embedding and LM head are seeded)");
    }
  }

  RunOutput run(const CaseSpec& s, const std::string& id,
                const RunOptions& options) const override {
    const tb::Config c(s);
    const ds::Dims dims(s);
    const TrainingConfig t(s);
    RunOutput result;

    tb::Measure generate_time(c, /*track_memory=*/false);
    const auto stack = ds::make_stack(c, dims);
    const auto embedding = normal_tensor(c.seed, "embedding", {t.vocab, dims.hidden}).to(c.dtype);
    const auto final_norm =
        (normal_tensor(c.seed, "final_norm", {dims.hidden}, 0.1) + 1.0).to(c.dtype);
    const auto lm_head = normal_tensor(c.seed, "lm_head", {t.vocab, dims.hidden},
                                       1.0 / std::sqrt(double(dims.hidden)))
                             .to(c.dtype);
    const auto successor = permutation(c.seed, "training.successor", t.vocab);
    std::vector<Batch> batches;
    for (int64_t step = 0; step < t.steps; ++step) {
      batches.push_back(make_batch(c, t, successor, step));
    }
    const FrozenModel frozen{embedding.to(c.device), final_norm.to(c.device), lm_head.to(c.device)};
    reference::CausalLm ref;
    ref.embedding = bridge::to_matrix(embedding);
    for (const auto& L : stack) ref.layers.push_back(L.ref);
    ref.final_norm = {bridge::to_matrix(final_norm.view({1, -1})).row(0), ds::kNormEps};
    ref.lm_head = bridge::to_matrix(lm_head);
    ref.shape = dims.attention(c);
    // Prod's packed words as generated: it must hand them back untouched.
    std::vector<std::vector<at::Tensor>> packed_before;
    for (const auto& L : stack) {
      for (const auto& p : L.projections) {
        packed_before.push_back(
            {p.prod.base.qweight.clone(), p.prod.base.qzeros.clone(), p.prod.base.scales.clone()});
      }
    }
    generate_time.finish("generate", result.metrics);

    const auto impl_layers = [&](tb::Impl impl) {
      std::vector<DecoderLayer> layers;
      for (const auto& L : stack) {
        layers.push_back(ds::device_layer(c, dims, L, impl, ref.shape.position_offset));
      }
      return layers;
    };
    const auto prod_layers = impl_layers(tb::Impl::kProd);
    const auto base_layers = impl_layers(tb::Impl::kBase);
    tb::Measure ref_time(c, /*track_memory=*/false);
    AdapterSnapshots snapshots;
    reference::RoundingNoise noise(tb::precision(c));
    std::vector<reference::Matrix> loss_variances;
    const auto reference = train_reference(ref, batches, t, c, snapshots, noise, loss_variances);
    ref_time.finish("ref", result.metrics);
    tb::Measure prod_time(c);
    const auto prod =
        train(frozen, prod_layers, batches, snapshots, t,
              {tb::Impl::kProd, impl::layer_ops(impl::Ops(options.impl), c.lora_args())});
    prod_time.finish("prod", result.metrics);
    tb::Measure base_time(c);
    const auto base = train(frozen, base_layers, batches, snapshots, t, {tb::Impl::kBase, {}});
    base_time.finish("base", result.metrics);

    report::LossCurve curve;
    curve.prod = prod.mean_loss, curve.base = base.mean_loss, curve.ref = reference.mean_loss;
    curve.grad_norm_prod = prod.grad_norm, curve.grad_norm_base = base.grad_norm;
    curve.grad_norm_ref = reference.grad_norm;
    tb::Checks losses(c, id + "/", options.keep_tensors, noise);
    for (int64_t step = 0; step < t.steps; ++step) {
      const reference::Matrix ref_losses =
          bridge::to_matrix(reference.forced_losses[step].view({-1, 1}));
      losses.add_as(
          "step" + std::to_string(step) + "/loss/token_loss",
          {prod.forced_losses[step], base.forced_losses[step], ref_losses, loss_variances[step]},
          {c.tokens()}, Expected{at::kFloat, at::kCPU}, ErrorStatistic::kMeanAbs);
    }
    auto loss_checks = losses.take();  // one per step, in step order
    for (int64_t step = 0; step < t.steps; ++step) {
      if (!loss_checks[step].passed && !curve.divergence_step) curve.divergence_step = step;
      result.checks.push_back(std::move(loss_checks[step]));
    }
    const auto prod_adapters = adapters(prod_layers), base_adapters = adapters(base_layers);
    for (size_t i = 0; i < stack.size(); ++i) {
      const auto& R = ref.layers[i];
      const reference::Projection* refs[] = {&R.q, &R.k, &R.v, &R.o, &R.gate, &R.up, &R.down};
      for (size_t j = 0; j < 7; ++j) {
        const auto& p = stack[i].projections[j];
        const std::string where =
            "layer" + std::to_string(i) + "/" + ds::module_of(j) + "/" + p.name + "/";
        // The trained adapters are reported, not gated: free-running AdamW divides by the
        // second moment, so elements whose gradient is near zero carry most of the drift
        // and the maximum over elements is a handful of samples (a correct fp32 case
        // failed the ratio rule on them).
        for (const auto& [impl, trained] :
             {std::pair{"prod", &prod_adapters}, std::pair{"base", &base_adapters}}) {
          double max_abs = 0, sum_abs = 0, count = 0;
          for (const auto part : {AdapterPart::kLoraA, AdapterPart::kLoraB}) {
            const auto diff =
                ((*trained)[adapter_slot(i, j, part)].detach().cpu().to(at::kDouble) -
                 bridge::to_tensor(part == AdapterPart::kLoraA ? refs[j]->lora_A : refs[j]->lora_B))
                    .abs();
            max_abs = std::max(max_abs, diff.max().item<double>());
            sum_abs += diff.sum().item<double>();
            count += static_cast<double>(diff.numel());
          }
          result.metrics.emplace_back("trained/" + where + "max_abs." + impl, max_abs);
          result.metrics.emplace_back("trained/" + where + "mean_abs." + impl, sum_abs / count);
        }
        // A backward must leave its adapters as it found them; the optimizer moves them.
        for (const auto part : {AdapterPart::kLoraA, AdapterPart::kLoraB}) {
          const size_t slot = adapter_slot(i, j, part);
          result.checks.push_back(
              compare_exact(id + "/unchanged_by_backward/" + where +
                                (part == AdapterPart::kLoraA ? "lora_A" : "lora_B"),
                            "after a backward vs before its forward", prod.after_backward[slot],
                            prod.before_forward[slot].to(at::kDouble), {}, options.keep_tensors));
        }
        const auto& before = packed_before[i * 7 + j];
        const std::pair<const char*, const at::Tensor*> frozen_parts[] = {
            {"qweight", &p.prod.base.qweight},
            {"qzeros", &p.prod.base.qzeros},
            {"scales", &p.prod.base.scales}};
        for (size_t k = 0; k < 3; ++k) {
          const auto& [name, now] = frozen_parts[k];
          const bool words = k < 2;
          result.checks.push_back(compare_exact(
              id + "/frozen/" + where + "gptq/" + name, "after training vs as generated",
              words ? as_packed_words(*now, name).cpu() : now->cpu(),
              words ? as_packed_words(before[k], name).cpu().to(at::kLong)
                    : before[k].cpu().to(at::kDouble),
              {}, options.keep_tensors));
        }
      }
    }
    result.metrics.emplace_back("loss.first", reference.mean_loss.front());
    result.metrics.emplace_back("loss.last", reference.mean_loss.back());
    result.loss_curve = std::move(curve);
    return result;
  }
};

}  // namespace

std::unique_ptr<CaseRunner> make_training_runner() {
  return std::make_unique<TrainingRunner>();
}

}  // namespace gradscope

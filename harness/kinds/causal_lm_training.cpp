#include "harness/kinds/causal_lm_training.h"

#include <ATen/ATen.h>
#include <torch/optim/adamw.h>

#include <algorithm>
#include <cmath>

#include "harness/baseline/aten_baseline.h"
#include "harness/common/llama_projections.h"
#include "harness/common/tensor_bridge.h"
#include "harness/generate/seeded_streams.h"

namespace gradscope::causal_lm_training {

namespace tb = lora_testbed;

TrainingConfig::TrainingConfig(const CaseSpec& s)
    : vocab(s.get_int("vocab")),
      steps(s.get_int("steps")),
      warmup(s.get_int("warmup")),
      lr(s.get_float("lr")),
      adamw{s.get_float("beta1"), s.get_float("beta2"), s.get_float("adam_eps"),
            s.get_float("weight_decay")} {}

std::vector<FieldSpec> TrainingConfig::fields() {
  return {
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
}

void TrainingConfig::validate(const CaseSpec& s) {
  for (const char* beta : {"beta1", "beta2"}) {
    if (s.get_float(beta) >= 1.0) {
      throw_field_error(s, beta,
                        "must be below 1 (the moments would never forget), got " +
                            report::format_spec_value(s.get_float(beta)));
    }
  }
}

double TrainingConfig::lr_at(int64_t step) const {
  return warmup > 0 ? lr * std::min(1.0, double(step + 1) / double(warmup)) : lr;
}

SeededModel make_model(const tb::Config& c, const decoder_stack::Dims& dims,
                       const TrainingConfig& t, std::vector<decoder_stack::StackLayer>& stack) {
  const auto embedding = normal_tensor(c.seed, "embedding", {t.vocab, dims.hidden}).to(c.dtype);
  const auto final_norm =
      (normal_tensor(c.seed, "final_norm", {dims.hidden}, 0.1) + 1.0).to(c.dtype);
  const auto lm_head =
      normal_tensor(c.seed, "lm_head", {t.vocab, dims.hidden}, 1.0 / std::sqrt(double(dims.hidden)))
          .to(c.dtype);
  SeededModel m;
  m.frozen = {embedding.to(c.device), final_norm.to(c.device), lm_head.to(c.device), dims.rms_eps};
  m.ref.embedding = bridge::to_matrix(embedding);
  for (auto& L : stack) m.ref.layers.push_back(std::move(L.ref));  // weights: no copy
  m.ref.final_norm = {bridge::to_matrix(final_norm.view({1, -1})).row(0), dims.rms_eps};
  m.ref.lm_head = bridge::to_matrix(lm_head);
  m.ref.shape = dims.attention(c);
  return m;
}

namespace {

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

// Each token's loss [batch * seq] in fp32. The embedding, final norm, LM head and loss are
// not under test: prod and the baseline share this code and differ only in the layers.
at::Tensor token_losses(const FrozenModel& m, const std::vector<DecoderLayer>& layers,
                        const Batch& batch, const LayerPass& pass) {
  auto h = m.embedding.index_select(0, batch.tokens.flatten())
               .view({batch.tokens.size(0), batch.tokens.size(1), -1});
  for (const auto& layer : layers) {
    h = pass.role == tb::Role::kProd ? decoder_layer(h, layer, pass.prod_ops)
                                     : baseline::decoder_layer(h, layer);
  }
  const auto logits = at::matmul(rms_norm(h, m.final_norm, m.norm_eps), m.lm_head.t());
  return at::cross_entropy_loss(logits.reshape({-1, m.lm_head.size(0)}).to(at::kFloat),
                                batch.targets, {}, at::Reduction::None);
}

std::vector<DecoderLayer> with_adapters(std::vector<DecoderLayer> layers, const Adapters& values) {
  for (size_t i = 0; i < layers.size(); ++i) {
    for (const auto& p : kLlamaProjections) {
      auto& projection = member(layers[i], p.name);
      projection.lora_A = values.at(adapter_path(i, std::string(p.name), "lora_A"));
      projection.lora_B = values.at(adapter_path(i, std::string(p.name), "lora_B"));
    }
  }
  return layers;
}

}  // namespace

std::vector<Batch> make_batches(const tb::Config& c, const TrainingConfig& t) {
  const auto successor = permutation(c.seed, "training.successor", t.vocab);
  std::vector<Batch> batches;
  for (int64_t step = 0; step < t.steps; ++step) {
    batches.push_back(make_batch(c, t, successor, step));
  }
  return batches;
}

std::string adapter_path(size_t layer, const std::string& projection, const char* part) {
  return "layer" + std::to_string(layer) + "/" + std::string(module_of(projection)) + "/" +
         projection + "/" + part;
}

std::vector<std::pair<std::string, at::Tensor>> adapters(const std::vector<DecoderLayer>& layers) {
  std::vector<std::pair<std::string, at::Tensor>> params;
  for (size_t i = 0; i < layers.size(); ++i) {
    for (const auto& p : kLlamaProjections) {
      const auto& projection = member(layers[i], p.name);
      params.emplace_back(adapter_path(i, std::string(p.name), "lora_A"), projection.lora_A);
      params.emplace_back(adapter_path(i, std::string(p.name), "lora_B"), projection.lora_B);
    }
  }
  return params;
}

Trajectory train(const FrozenModel& m, const std::vector<DecoderLayer>& layers,
                 const std::vector<Batch>& batches, const AdapterSnapshots& reference_adapters,
                 const TrainingConfig& t, const LayerPass& pass) {
  const auto named = adapters(layers);
  std::vector<at::Tensor> params;
  for (const auto& [path, p] : named) params.push_back(p);
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
    Adapters before;
    if (!backward_changed_adapters) {
      for (const auto& [path, p] : named) before[path] = p.detach().cpu().clone();
    }
    const auto loss = token_losses(m, layers, batches[step], pass).mean();
    loss.backward();
    if (!backward_changed_adapters) {
      out.before_forward = std::move(before);
      out.after_backward.clear();
      for (const auto& [path, p] : named) {
        const auto after = p.detach().cpu().clone();
        backward_changed_adapters |= !after.equal(out.before_forward.at(path));
        out.after_backward[path] = after;
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

Trajectory train_reference(reference::CausalLm& model, const std::vector<Batch>& batches,
                           const TrainingConfig& t, const tb::Config& c,
                           AdapterSnapshots& snapshots, reference::RoundingNoise& noise,
                           std::vector<StepFloor>& floors) {
  struct Param {
    size_t layer;
    std::string projection;
    bool lora_A;
    std::string path;
    reference::Matrix* value;
    reference::AdamWState state;
    const reference::Matrix& grad(const reference::LossAndGrads& r) const {
      const auto& g = member(r.grads[layer], projection);
      return lora_A ? g.dA : g.dB;
    }
  };
  std::vector<Param> params;
  for (size_t i = 0; i < model.layers.size(); ++i) {
    for (const auto& p : kLlamaProjections) {
      const std::string name(p.name);
      auto& projection = member(model.layers[i], p.name);
      params.push_back({i, name, true, adapter_path(i, name, "lora_A"), &projection.lora_A, {}});
      params.push_back({i, name, false, adapter_path(i, name, "lora_B"), &projection.lora_B, {}});
    }
  }
  Trajectory out;
  for (int64_t step = 0; step < t.steps; ++step) {
    // Parameters live in the adapter dtype, here as in prod (AdamW's moments stay fp64):
    // the gated losses of prod and the reference are then on identical adapters.
    auto& snapshot = snapshots.emplace_back();
    for (const auto& p : params) {
      const auto rounded = bridge::to_tensor(*p.value).to(c.adapter_dtype);
      snapshot[p.path] = rounded.to(c.device);
      *p.value = bridge::to_matrix(rounded);
    }
    const auto& b = batches[step];
    const auto result = reference::causal_lm_backward(model, b.ref_tokens, b.ref_targets);
    // The floor of this step's gated losses: a careful implementation's rounding noise on
    // exactly these adapters and tokens.
    auto& floor = floors.emplace_back();
    floor.loss_variance = noise.token_losses(model, b.ref_tokens, b.ref_targets, &floor.scores);
    double squares = 0;
    for (const auto& p : params) squares += p.grad(result).squaredNorm();
    out.forced_losses.push_back(bridge::to_tensor(reference::Matrix(result.losses)).view({-1}));
    out.mean_loss.push_back(result.losses.mean());
    out.grad_norm.push_back(std::sqrt(squares));
    for (auto& p : params)
      reference::adamw_step(*p.value, p.grad(result), p.state, t.lr_at(step), t.adamw);
  }
  return out;
}

}  // namespace gradscope::causal_lm_training

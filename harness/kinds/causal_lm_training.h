// The training kind's model and loops: a small causal LM (frozen embedding, a stack of GPTQ
// decoder layers with LoRA on all seven projections, frozen final RMSNorm and LM head,
// next-token cross-entropy) trained for N AdamW steps by prod, the baseline (PyTorch's own
// AdamW: the optimizer is not under test, the gradients feeding it are) and the fp64
// reference (its own AdamW). Adapters travel by path, layer<i>/<module>/<projection>/lora_A.
#pragma once

#include <ATen/core/Tensor.h>

#include <map>
#include <string>
#include <vector>

#include "gradscope/decoder_layer.h"
#include "harness/kinds/decoder_stack.h"
#include "reference/causal_lm_reference.h"

namespace gradscope::causal_lm_training {

// The case's training fields (vocab, steps, the AdamW settings), declared and read here.
struct TrainingConfig {
  int64_t vocab, steps, warmup;
  double lr;
  reference::AdamWConfig adamw;
  explicit TrainingConfig(const CaseSpec& s);
  static std::vector<FieldSpec> fields();
  static void validate(const CaseSpec& s);  // what the fields' ranges cannot say
  // Linear warmup over the first `warmup` steps, then constant.
  double lr_at(int64_t step) const;
};

// One step's token sequences: a seeded Markov chain over the vocabulary (the next token
// is a fixed successor of the current one three times in four, else uniform), so there
// is something to learn and the loss falls.
struct Batch {
  at::Tensor tokens;   // int64 [batch, seq], case device
  at::Tensor targets;  // int64 [batch * seq], the following tokens
  std::vector<int64_t> ref_tokens, ref_targets;
};
std::vector<Batch> make_batches(const lora_testbed::Config& c, const TrainingConfig& t);

// The frozen parts of the model around the layers, as prod and the baseline hold them.
struct FrozenModel {
  at::Tensor embedding, final_norm, lm_head;  // case dtype, device
  double norm_eps = 1e-5;                     // the final RMSNorm's
};

// The model around a seeded stack: the frozen embedding, final norm and LM head drawn from the
// case's seed, for prod and the baseline on the case device, and the reference's fp64 model,
// which takes each layer's reference weights out of `stack`.
struct SeededModel {
  FrozenModel frozen;
  reference::CausalLm ref;
};
SeededModel make_model(const lora_testbed::Config& c, const decoder_stack::Dims& dims,
                       const TrainingConfig& t, std::vector<decoder_stack::StackLayer>& stack);

// Which layers a pass runs: prod's, whose LoRA ops are the implementation under test's
// operators, or the baseline's.
struct LayerPass {
  lora_testbed::Role role;
  LayerLoraOps prod_ops;  // prod only
};

using Adapters = std::map<std::string, at::Tensor>;  // by path
std::string adapter_path(size_t layer, const std::string& projection, const char* part);
// The adapters of a stack, by path, in the stack's order.
std::vector<std::pair<std::string, at::Tensor>> adapters(const std::vector<DecoderLayer>& layers);

struct Trajectory {
  std::vector<double> mean_loss, grad_norm;  // free-running, per step
  // Each adapter just before a forward and just after its backward (host), from the first
  // step where a backward changed any adapter, else from the last step.
  Adapters before_forward, after_backward;
  // Per step, each token's loss [tokens] on the reference's adapters of that step: the gated
  // comparison (host; fp32 for prod and base, fp64 for the reference).
  std::vector<at::Tensor> forced_losses;
};

// The reference's adapters at every step, in the adapter dtype on the case device: what prod
// and the baseline evaluate the gated losses on.
using AdapterSnapshots = std::vector<Adapters>;

// Trains the adapters in `layers` in place and, before each step, evaluates the token losses
// on the reference's adapters of that step.
Trajectory train(const FrozenModel& m, const std::vector<DecoderLayer>& layers,
                 const std::vector<Batch>& batches, const AdapterSnapshots& reference_adapters,
                 const TrainingConfig& t, const LayerPass& pass);

// The floor of one step's gated token losses: their variance, and each layer's largest
// attention score error, which says whether the floor's model holds there.
struct StepFloor {
  reference::Matrix loss_variance;
  std::vector<reference::ScoreError> scores;
};

// The fp64 reference's training run; the trained adapters are left in `model`, each step's
// adapters, rounded to the adapter dtype, appended to `snapshots`, and each step's floor to
// `floors`.
Trajectory train_reference(reference::CausalLm& model, const std::vector<Batch>& batches,
                           const TrainingConfig& t, const lora_testbed::Config& c,
                           AdapterSnapshots& snapshots, reference::RoundingNoise& noise,
                           std::vector<StepFloor>& floors);

}  // namespace gradscope::causal_lm_training

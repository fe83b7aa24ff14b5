// fp64 reference of a small causal language model around the decoder layers, and of
// AdamW: a frozen embedding, the layer stack, a frozen final RMSNorm and LM head, and
// next-token cross-entropy; the backward returns every adapter's gradient of the mean
// loss. AdamW follows Loshchilov & Hutter with bias correction, as PyTorch documents it.
// Checked against finite differences (and AdamW against torch's) in tests/.
#pragma once

#include <vector>

#include "reference/layer_reference.h"

namespace gradscope::reference {

struct CausalLm {
  Matrix embedding;  // [vocab, hidden], frozen
  std::vector<Layer> layers;
  RmsNorm final_norm;  // frozen
  Matrix lm_head;      // [vocab, hidden], frozen: logits = norm(h) lm_head^T
  AttentionShape shape;
};

// Per-token cross-entropy -log softmax(logits)[target], one entry per row of `tokens`
// (batch-major like the layers' rows); `tokens` and `targets` hold vocabulary indices.
Eigen::VectorXd token_losses(const CausalLm& model, const std::vector<int64_t>& tokens,
                             const std::vector<int64_t>& targets);

// token_losses and the gradients of their mean for each layer's adapters (the layers' dx
// are intermediate values).
struct LossAndGrads {
  Eigen::VectorXd losses;
  std::vector<LayerGrads> grads;
};
LossAndGrads causal_lm_backward(const CausalLm& model, const std::vector<int64_t>& tokens,
                                const std::vector<int64_t>& targets);

struct AdamWConfig {
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.0;
};
// One parameter's optimizer state.
struct AdamWState {
  Matrix exp_avg, exp_avg_sq;
  int64_t steps = 0;
};
// One AdamW step with learning rate `lr`: decoupled decay p -= lr wd p, moments, bias
// correction, p -= lr m_hat / (sqrt(v_hat) + eps).
void adamw_step(Matrix& param, const Matrix& grad, AdamWState& state, double lr,
                const AdamWConfig& config);

}  // namespace gradscope::reference

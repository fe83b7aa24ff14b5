#include "reference/causal_lm_reference.h"

#include <cmath>
#include <stdexcept>
#include <string>

#include "reference/dense_product.h"

namespace gradscope::reference {
namespace {

Matrix embed(const CausalLm& m, const std::vector<int64_t>& tokens) {
  Matrix x(static_cast<int64_t>(tokens.size()), m.embedding.cols());
  for (size_t t = 0; t < tokens.size(); ++t) {
    if (tokens[t] < 0 || tokens[t] >= m.embedding.rows()) {
      throw std::out_of_range("token " + std::to_string(tokens[t]) + " outside the vocabulary");
    }
    x.row(static_cast<int64_t>(t)) = m.embedding.row(tokens[t]);
  }
  return x;
}

// Row-wise softmax of the logits, computed stably.
Matrix softmax_rows(const Matrix& logits) {
  Matrix p(logits.rows(), logits.cols());
  for (int64_t t = 0; t < logits.rows(); ++t) {
    const double m = logits.row(t).maxCoeff();
    p.row(t) = (logits.row(t).array() - m).exp().matrix();
    p.row(t) /= p.row(t).sum();
  }
  return p;
}

struct Forward {
  std::vector<Matrix> layer_inputs;  // input of layer i
  std::vector<LayerTape> tapes;      // what layer i's backward needs
  Matrix last;                       // output of the last layer
  Matrix logits;
};

Forward forward(const CausalLm& m, const std::vector<int64_t>& tokens) {
  Forward f;
  Matrix h = embed(m, tokens);
  for (const auto& layer : m.layers) {
    f.layer_inputs.push_back(h);
    f.tapes.push_back(layer_tape(h, layer, m.shape));
    h = f.tapes.back().out;
  }
  f.logits = product(rmsnorm_forward(h, m.final_norm), Op::kPlain, m.lm_head, Op::kTransposed);
  f.last = std::move(h);
  return f;
}

Eigen::VectorXd losses_of(const Matrix& logits, const std::vector<int64_t>& targets) {
  Eigen::VectorXd loss(logits.rows());
  for (int64_t t = 0; t < logits.rows(); ++t) {
    const double m = logits.row(t).maxCoeff();
    const double lse = m + std::log((logits.row(t).array() - m).exp().sum());
    loss(t) = lse - logits(t, targets[t]);
  }
  return loss;
}

}  // namespace

Eigen::VectorXd token_losses(const CausalLm& model, const std::vector<int64_t>& tokens,
                             const std::vector<int64_t>& targets) {
  return losses_of(forward(model, tokens).logits, targets);
}

LossAndGrads causal_lm_backward(const CausalLm& model, const std::vector<int64_t>& tokens,
                                const std::vector<int64_t>& targets) {
  const Forward f = forward(model, tokens);
  LossAndGrads out;
  out.losses = losses_of(f.logits, targets);
  // d mean(loss) / d logits = (softmax - onehot(target)) / tokens.
  Matrix dlogits = softmax_rows(f.logits);
  for (int64_t t = 0; t < dlogits.rows(); ++t) dlogits(t, targets[t]) -= 1.0;
  dlogits /= static_cast<double>(dlogits.rows());
  Matrix dh = rmsnorm_backward(f.last, dlogits * model.lm_head, model.final_norm);
  out.grads.resize(model.layers.size());
  for (size_t i = model.layers.size(); i-- > 0;) {
    out.grads[i] = layer_backward(f.tapes[i], f.layer_inputs[i], dh, model.layers[i], model.shape);
    dh = out.grads[i].dx;
  }
  return out;
}

void adamw_step(Matrix& param, const Matrix& grad, AdamWState& s, double lr, const AdamWConfig& c) {
  if (s.steps == 0) {
    s.exp_avg = Matrix::Zero(param.rows(), param.cols());
    s.exp_avg_sq = Matrix::Zero(param.rows(), param.cols());
  }
  ++s.steps;
  param *= 1.0 - lr * c.weight_decay;
  s.exp_avg = c.beta1 * s.exp_avg + (1.0 - c.beta1) * grad;
  s.exp_avg_sq = c.beta2 * s.exp_avg_sq + (1.0 - c.beta2) * grad.cwiseAbs2();
  const double correction1 = 1.0 - std::pow(c.beta1, static_cast<double>(s.steps));
  const double correction2 = 1.0 - std::pow(c.beta2, static_cast<double>(s.steps));
  const Matrix denom = ((s.exp_avg_sq / correction2).cwiseSqrt().array() + c.eps).matrix();
  param -= (lr / correction1) * s.exp_avg.cwiseQuotient(denom);
}

}  // namespace gradscope::reference

// The training kind: the reference's fp64 AdamW takes the steps PyTorch's torch::optim::AdamW
// takes (the optimizer prod and the baseline use), and the kind's fields refuse what
// cannot train.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/optim/adamw.h>

#include "harness/catalog/case_file.h"
#include "harness/common/input_error.h"
#include "harness/common/tensor_bridge.h"
#include "harness/spec/case_spec.h"
#include "reference/causal_lm_reference.h"

namespace gradscope {
namespace {

TEST(TrainingAdamW, ReferenceMatchesTorchOptimInFp64) {
  const auto initial = at::randn({4, 5}, at::TensorOptions().dtype(at::kDouble));
  auto param = initial.clone().requires_grad_(true);
  const reference::AdamWConfig config{0.8, 0.95, 1e-6, 0.05};
  torch::optim::AdamW optimizer({param}, torch::optim::AdamWOptions(0.01)
                                             .betas({config.beta1, config.beta2})
                                             .eps(config.eps)
                                             .weight_decay(config.weight_decay));
  reference::Matrix ref = bridge::to_matrix(initial);
  reference::AdamWState state;
  for (int step = 0; step < 6; ++step) {
    const double lr = 0.01 * (step + 1) / 3.0;  // a warmup: the rate changes between steps
    static_cast<torch::optim::AdamWOptions&>(optimizer.param_groups()[0].options()).lr(lr);
    const auto grad = at::randn({4, 5}, at::TensorOptions().dtype(at::kDouble)) * (step + 1);
    param.mutable_grad() = grad.clone();
    optimizer.step();
    reference::adamw_step(ref, bridge::to_matrix(grad), state, lr, config);
    const double diff = (param.detach() - bridge::to_tensor(ref)).abs().max().item<double>();
    EXPECT_LT(diff, 1e-14) << "step " << step;
  }
  // Not vacuous: the parameters moved by far more than the agreement.
  EXPECT_GT((param.detach() - initial).abs().max().item<double>(), 1e-3);
}

std::string training_case(const std::string& extra) {
  return "kind = \"training\"\nhidden = 64\nintermediate = 128\nlayers = 1\nvocab = 32\n" + extra;
}

TEST(TrainingCase, RefusesWhatCannotTrain) {
  const std::pair<const char*, const char*> bad[] = {{"beta2 = 1.0\n", "beta2"},
                                                     {"steps = 0\n", "steps"},
                                                     {"vocab = 1\n", "vocab"},
                                                     {"lr = 0.0\n", "lr"},
                                                     {"dropout = 0.1\n", "dropout"},
                                                     {"batch = 0\n", "batch"},
                                                     {"checkpoint = \"x\"\n", "checkpoint"},
                                                     {"kv_heads = 3\n", "kv_heads"}};
  for (const auto& [text, field] : bad) {
    try {
      parse_case_text(training_case(text), "t.toml");
      ADD_FAILURE() << "accepted: " << text;
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find("t.toml"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(field), std::string::npos) << e.what();
    }
  }
  EXPECT_EQ(parse_case_text(training_case(""), "t.toml").size(), 1u);
}

}  // namespace
}  // namespace gradscope

// The end-to-end rule (docs/verification.md, "End to end"): a whole model's loss and LoRA
// gradients judged by statistics over many elements, where the floor's per-operation model
// has nothing to say (the embedding, the loss, a chain of layers). Beside compare_ratio, the
// element-wise rule the per-module checks use.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>
#include <string>
#include <vector>

#include "reports/report_types.h"

namespace gradscope {

// The end-to-end limit is this many times the baseline's statistic.
inline constexpr double kEndToEndRatio = 2.0;

// A statistic the rule cannot judge on (the exact gradient all zero: no result tells a
// correct model from one that returns zeros): the case is not judged, not failed.
struct EndToEndNotJudged : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// One LoRA gradient: prod (none where the model's loss does not reach it), base, ref (fp64),
// and the dtype prod must have.
struct GradientRuns {
  std::optional<at::Tensor> prod;
  at::Tensor base, ref;
  at::ScalarType expected = at::kFloat;
};
// ||prod - ref|| <= 2 ||base - ref|| (Frobenius norms). The check's statistic is "frobenius",
// its value the norm; the message names the largest element difference and the three values
// there. Throws EndToEndNotJudged for an all-zero reference.
report::Check judge_gradient(const std::string& where, const std::string& name,
                             const GradientRuns& runs, bool keep_tensors);

// The losses of the three runs: the model's own loss (a scalar) and the per-token losses.
struct LossRuns {
  at::Tensor prod_loss, base_loss, ref_loss;        // scalars; prod's in its own dtype
  at::Tensor prod_tokens, base_tokens, ref_tokens;  // per-token losses, ref's in fp64
};
// per_token_loss: mean |prod - ref| <= 2 mean |base - ref|; loss: |prod - ref| within the same
// base term plus the floor of the mean's own rounding in the loss's dtype. `prefix` goes before
// each name (a training step's "step3."), `step` into the messages (0: none).
std::vector<report::Check> judge_losses(const std::string& where, const LossRuns& runs,
                                        const std::string& prefix, int step, bool keep_tensors);

}  // namespace gradscope

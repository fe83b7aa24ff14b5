// LoRA_MLP: SwiGLU MLP with LoRA on gate, up and down. Saves x, e, g; recomputes h.
#include <ATen/ATen.h>

#include "gradscope/lora_ops.h"
#include "gradscope/swiglu.h"
#include "lora_projection.h"

namespace gradscope {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

struct LoraMlpFunction : torch::autograd::Function<LoraMlpFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& a_gate,
                            const at::Tensor& b_gate, const at::Tensor& a_up,
                            const at::Tensor& b_up, const at::Tensor& a_down,
                            const at::Tensor& b_down,
                            const std::vector<detail::FrozenProjection>& frozen,
                            const LoraDropout& dropout_x, const LoraDropout& dropout_h) {
    const auto x2 = detail::rows(x);
    const auto gate = detail::projection_forward(x2, dropout_x, frozen[0], a_gate, b_gate);
    const auto up = detail::projection_forward(x2, dropout_x, frozen[1], a_up, b_up);
    const auto h = swiglu_forward(gate.y, up.y);
    const auto down = detail::projection_forward(h, dropout_h, frozen[2], a_down, b_down);
    ctx->save_for_backward(
        {x, a_gate, b_gate, a_up, b_up, a_down, b_down, gate.y, up.y, gate.xa, up.xa, down.xa});
    detail::save_frozen(ctx, "gate", frozen[0]);
    detail::save_frozen(ctx, "up", frozen[1]);
    detail::save_frozen(ctx, "down", frozen[2]);
    detail::save_dropout(ctx, "x", dropout_x);
    detail::save_dropout(ctx, "h", dropout_h);
    auto shape = x.sizes().vec();
    shape.back() = down.y.size(1);
    return detail::as_output(down.y.view(shape));
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const auto s = ctx->get_saved_variables();
    const auto& x = s[0];
    const auto& e = s[7];
    const auto& g = s[8];
    const auto dropout_x = detail::load_dropout(ctx, "x");
    const auto dropout_h = detail::load_dropout(ctx, "h");
    const auto dy2 = detail::rows(grad_outputs[0]).to(x.scalar_type());
    const auto h = swiglu_forward(e, g);  // recomputed: cheaper than keeping it
    auto down = detail::projection_backward(dy2, h, dropout_h, s[11],
                                            detail::load_frozen(ctx, "down"), s[5], s[6],
                                            /*need_dx=*/true);
    const auto [de, dg] = swiglu_backward(down.dx, e, g);
    const auto x2 = detail::rows(x);
    const bool need_dx = ctx->needs_input_grad(0);
    auto up = detail::projection_backward(dg, x2, dropout_x, s[10], detail::load_frozen(ctx, "up"),
                                          s[3], s[4], need_dx);
    auto gate = detail::projection_backward(de, x2, dropout_x, s[9],
                                            detail::load_frozen(ctx, "gate"), s[1], s[2], need_dx);
    at::Tensor dx = need_dx ? up.dx.add_(gate.dx).view(x.sizes()) : at::Tensor();
    return {dx,      gate.dA, gate.dB,      up.dA,        up.dB,
            down.dA, down.dB, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor lora_mlp(const at::Tensor& x, const LoraProjection& gate, const LoraProjection& up,
                    const LoraProjection& down, const LoraDropout& dropout_x,
                    const LoraDropout& dropout_h) {
  detail::validate_projection("lora_mlp", "gate", x, gate);
  detail::validate_projection("lora_mlp", "up", x, up);
  TORCH_CHECK(gate.base.out_features() == up.base.out_features(), "lora_mlp: gate has ",
              gate.base.out_features(), " outputs but up has ", up.base.out_features());
  TORCH_CHECK(down.base.in_features() == gate.base.out_features(),
              "lora_mlp: down has in_features ", down.base.in_features(), " but gate/up produce ",
              gate.base.out_features());
  detail::validate_dropout("lora_mlp", "x", x, dropout_x);
  TORCH_CHECK(dropout_h.p >= 0 && dropout_h.p < 1, "lora_mlp h: dropout p must lie in [0, 1), got ",
              dropout_h.p);
  if (dropout_h.p > 0) {
    TORCH_CHECK(dropout_h.mask.defined() && dropout_h.mask.scalar_type() == at::kBool &&
                    dropout_h.mask.numel() == x.numel() / x.size(-1) * down.base.in_features(),
                "lora_mlp h: dropout mask must be bool with one element per element of h [tokens, ",
                down.base.in_features(), "]");
  }
  const std::vector<detail::FrozenProjection> frozen = {
      detail::frozen_part(gate), detail::frozen_part(up), detail::frozen_part(down)};
  // validate_projection for down needs an x of its input width; check its adapter shapes here.
  TORCH_CHECK(down.lora_A.defined() && down.lora_A.dim() == 2 &&
                  down.lora_A.size(1) == down.base.in_features() && down.lora_B.defined() &&
                  down.lora_B.dim() == 2 && down.lora_B.size(0) == down.base.out_features() &&
                  down.lora_B.size(1) == down.lora_A.size(0),
              "lora_mlp down: lora_A must be [r, ", down.base.in_features(), "] and lora_B [",
              down.base.out_features(), ", r]");
  return LoraMlpFunction::apply(x, gate.lora_A, gate.lora_B, up.lora_A, up.lora_B, down.lora_A,
                                down.lora_B, frozen, dropout_x, dropout_h);
}

}  // namespace gradscope

// LoRA_W: one fused projection (o_proj).
#include <ATen/ATen.h>

#include "gradscope/lora_ops.h"
#include "lora_projection.h"

namespace gradscope {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

struct LoraWFunction : torch::autograd::Function<LoraWFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& lora_a,
                            const at::Tensor& lora_b, const detail::FrozenProjection& frozen,
                            const LoraDropout& dropout) {
    const auto x2 = detail::rows(x);
    const auto out = detail::projection_forward(x2, dropout, frozen, lora_a, lora_b);
    ctx->save_for_backward({x, lora_a, lora_b, out.xa});
    detail::save_frozen(ctx, "w", frozen);
    detail::save_dropout(ctx, "x", dropout);
    auto shape = x.sizes().vec();
    shape.back() = out.y.size(1);
    return detail::as_output(out.y.view(shape));
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    const auto& x = saved[0];
    const auto dropout = detail::load_dropout(ctx, "x");
    const auto x2 = detail::rows(x);
    const auto dy2 = detail::rows(grad_outputs[0]).to(x.scalar_type());
    auto g = detail::projection_backward(dy2, x2, dropout, saved[3], detail::load_frozen(ctx, "w"),
                                         saved[1], saved[2], ctx->needs_input_grad(0));
    return {g.dx.defined() ? g.dx.view(x.sizes()) : at::Tensor(), g.dA, g.dB, at::Tensor(),
            at::Tensor()};
  }
};

}  // namespace

at::Tensor lora_w(const at::Tensor& x, const LoraProjection& proj, const LoraDropout& dropout) {
  detail::validate_projection("lora_w", "projection", x, proj);
  detail::validate_dropout("lora_w", "projection", x, dropout);
  return LoraWFunction::apply(x, proj.lora_A, proj.lora_B, detail::frozen_part(proj), dropout);
}

}  // namespace gradscope

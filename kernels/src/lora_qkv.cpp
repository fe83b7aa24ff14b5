// LoRA_QKV: q, k and v projections of one input, dX summed over the three.
#include <ATen/ATen.h>

#include "gradscope/lora_ops.h"
#include "lora_projection.h"

namespace gradscope {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

constexpr const char* kNames[3] = {"q", "k", "v"};

struct LoraQkvFunction : torch::autograd::Function<LoraQkvFunction> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& a_q,
                               const at::Tensor& b_q, const at::Tensor& a_k, const at::Tensor& b_k,
                               const at::Tensor& a_v, const at::Tensor& b_v,
                               const std::vector<detail::FrozenProjection>& frozen,
                               const LoraDropout& dropout) {
    const auto x2 = detail::rows(x);
    const at::Tensor a[3] = {a_q, a_k, a_v}, b[3] = {b_q, b_k, b_v};
    variable_list outputs, xa;
    for (int i = 0; i < 3; ++i) {  // one dense weight alive at a time
      auto out = detail::projection_forward(x2, dropout, frozen[i], a[i], b[i]);
      auto shape = x.sizes().vec();
      shape.back() = out.y.size(1);
      outputs.push_back(detail::as_output(out.y.view(shape)));
      xa.push_back(out.xa);
      detail::save_frozen(ctx, kNames[i], frozen[i]);
    }
    ctx->save_for_backward({x, a_q, b_q, a_k, b_k, a_v, b_v, xa[0], xa[1], xa[2]});
    detail::save_dropout(ctx, "x", dropout);
    return outputs;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    const auto& x = saved[0];
    const auto dropout = detail::load_dropout(ctx, "x");
    const auto x2 = detail::rows(x);
    const bool need_dx = ctx->needs_input_grad(0);
    // Autograd materialises the gradient of an unused output as zeros, so every
    // grad_outputs[i] is defined.
    variable_list grads(9);
    at::Tensor dx;
    for (int i = 0; i < 3; ++i) {
      const auto& lora_a = saved[1 + 2 * i];
      const auto& lora_b = saved[2 + 2 * i];
      const auto dy2 = detail::rows(grad_outputs[i]).to(x.scalar_type());
      auto g =
          detail::projection_backward(dy2, x2, dropout, saved[7 + i],
                                      detail::load_frozen(ctx, kNames[i]), lora_a, lora_b, need_dx);
      if (need_dx) dx = dx.defined() ? dx.add_(g.dx) : g.dx;
      grads[1 + 2 * i] = g.dA;
      grads[2 + 2 * i] = g.dB;
    }
    if (need_dx) grads[0] = dx.defined() ? dx.view(x.sizes()) : at::zeros_like(x);
    return grads;
  }
};

}  // namespace

std::vector<at::Tensor> lora_qkv(const at::Tensor& x, const LoraProjection& q,
                                 const LoraProjection& k, const LoraProjection& v,
                                 const LoraDropout& dropout) {
  detail::validate_projection("lora_qkv", "q", x, q);
  detail::validate_projection("lora_qkv", "k", x, k);
  detail::validate_projection("lora_qkv", "v", x, v);
  detail::validate_dropout("lora_qkv", "x", x, dropout);
  const std::vector<detail::FrozenProjection> frozen = {
      detail::frozen_part(q), detail::frozen_part(k), detail::frozen_part(v)};
  return LoraQkvFunction::apply(x, q.lora_A, q.lora_B, k.lora_A, k.lora_B, v.lora_A, v.lora_B,
                                frozen, dropout);
}

}  // namespace gradscope

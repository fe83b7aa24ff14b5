#include "gradscope/decoder_layer.h"

#include <ATen/ATen.h>

#include <cmath>

#include "gradscope/faults.h"

namespace gradscope {
namespace {

// cos and sin [seq, head_dim] of the rotate-half convention for positions first ..
// first + seq - 1, in fp32 then x's dtype (positions above 256 are not integers in bf16).
std::pair<at::Tensor, at::Tensor> rope_tables(const DecoderLayer& l, int64_t seq, int64_t head_dim,
                                              const at::Tensor& like) {
  const int64_t first = l.position_offset;
  const double theta = l.rope_theta;
  const auto table = like.options().dtype(
      fault_active(Fault::kRopeTableInActivationDtype) ? like.scalar_type() : at::kFloat);
  const auto f32 = like.options().dtype(at::kFloat);
  const auto inv_freq = scaled_rope_frequencies(
      l,
      at::pow(theta, at::arange(0, head_dim, 2, f32) / static_cast<double>(head_dim)).reciprocal());
  const auto angles = at::outer(at::arange(first, first + seq, table), inv_freq.to(table));
  const auto both = at::cat({angles, angles}, -1);
  return {both.cos().to(like.scalar_type()), both.sin().to(like.scalar_type())};
}

// x [batch, heads, seq, head_dim]: x cos + rotate_half(x) sin.
at::Tensor apply_rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const int64_t half = x.size(-1) / 2;
  const auto rotated = at::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
  return x * cos + rotated * sin;
}

}  // namespace

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  const auto x32 = x.to(at::kFloat);
  // The fault squares and averages in x's own dtype: fp16 x^2 overflows at |x| >= 256.
  const auto variance = fault_active(Fault::kRmsNormVarianceInActivationDtype)
                            ? x.pow(2).mean(-1, /*keepdim=*/true).to(at::kFloat)
                            : x32.pow(2).mean(-1, /*keepdim=*/true);
  const auto normed = x32 * at::rsqrt(variance + eps);
  return weight * normed.to(x.scalar_type());
}

at::Tensor scaled_rope_frequencies(const DecoderLayer& l, const at::Tensor& f) {
  if (l.rope_type != "llama3") return f;
  const double old_context = l.rope_original_max_position;
  const auto wavelength = (2 * M_PI) / f;
  const auto low =
      at::where(wavelength > old_context / l.rope_low_freq_factor, f / l.rope_factor, f);
  const auto smooth = (old_context / wavelength - l.rope_low_freq_factor) /
                      (l.rope_high_freq_factor - l.rope_low_freq_factor);
  const auto blended = (1 - smooth) * low / l.rope_factor + smooth * low;
  const auto medium = (wavelength >= old_context / l.rope_high_freq_factor)
                          .logical_and(wavelength <= old_context / l.rope_low_freq_factor);
  return at::where(medium, blended, low);
}

double attention_scale(const DecoderLayer& l, int64_t head_dim) {
  return l.attention_scaling > 0 ? l.attention_scaling
                                 : 1.0 / std::sqrt(static_cast<double>(head_dim));
}

at::Tensor residual_branch(const DecoderLayer& l, const at::Tensor& branch) {
  return l.residual_multiplier == 1.0 ? branch : branch * l.residual_multiplier;
}

at::Tensor decoder_layer(const at::Tensor& x, const DecoderLayer& l, const LayerLoraOps& ops) {
  TORCH_CHECK(x.dim() == 3, "decoder_layer: x must be [batch, seq, hidden], got ", x.sizes());
  TORCH_CHECK(
      l.heads > 0 && l.kv_heads > 0 && l.heads % l.kv_heads == 0 && x.size(2) % l.heads == 0,
      "decoder_layer: ", l.heads, " heads and ", l.kv_heads, " key/value heads do not fit hidden ",
      x.size(2));
  const int64_t batch = x.size(0), seq = x.size(1), hidden = x.size(2);
  const int64_t head_dim = hidden / l.heads;
  const auto n1 = rms_norm(x, l.input_norm, l.norm_eps);
  const auto qkv = ops.qkv ? ops.qkv(n1, l.q, l.k, l.v) : lora_qkv(n1, l.q, l.k, l.v);
  const auto heads = [&](const at::Tensor& t, int64_t n) {
    return t.view({batch, seq, n, head_dim}).transpose(1, 2);
  };
  const auto [cos, sin] = rope_tables(l, seq, head_dim, x);
  const auto q = apply_rope(heads(qkv[0], l.heads), cos, sin);
  const auto k = apply_rope(heads(qkv[1], l.kv_heads), cos, sin);
  const auto v = heads(qkv[2], l.kv_heads);
  const auto attn = at::scaled_dot_product_attention(q, k, v, {}, 0.0, /*is_causal=*/true,
                                                     attention_scale(l, head_dim),
                                                     /*enable_gqa=*/l.heads != l.kv_heads);
  const auto merged = attn.transpose(1, 2).reshape({batch, seq, hidden});
  const auto h = x + residual_branch(l, ops.w ? ops.w(merged, l.o) : lora_w(merged, l.o));
  const auto n2 = rms_norm(h, l.post_attention_norm, l.norm_eps);
  return h + residual_branch(l, ops.mlp ? ops.mlp(n2, l.gate, l.up, l.down)
                                        : lora_mlp(n2, l.gate, l.up, l.down));
}

}  // namespace gradscope

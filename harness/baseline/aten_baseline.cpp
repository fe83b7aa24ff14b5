#include "harness/baseline/aten_baseline.h"

#include <ATen/ATen.h>

#include <cmath>

namespace gradscope::baseline {
namespace {

// Element i of each column of `words` (int32 [W, C], packed along dim 0).
at::Tensor unpack_dim0(const at::Tensor& words, int bits, int64_t count) {
  const auto u = words.to(at::kLong).bitwise_and(0xFFFFFFFFLL);
  const auto padded = at::cat({u, at::zeros({1, u.size(1)}, u.options())}, 0);
  const auto bit = at::arange(count, u.options()) * bits;
  const auto word = at::floor_divide(bit, 32);
  const auto shift = at::remainder(bit, 32).unsqueeze(1);
  const auto low = padded.index_select(0, word);
  const auto high = padded.index_select(0, word + 1);
  // A field straddling two words (3-bit) is read from the 64-bit pair.
  const auto pair = low.bitwise_or(high.bitwise_left_shift(32));
  return pair.bitwise_right_shift(shift).bitwise_and((1LL << bits) - 1);
}

at::Tensor dropout_input(const at::Tensor& x, const LoraDropout& d) {
  if (d.p == 0) return x;
  return x * d.mask.reshape(x.sizes()).to(x.scalar_type()) * (1.0 / (1.0 - d.p));
}

}  // namespace

at::Tensor dequantize(const GptqWeight& w, at::ScalarType dtype) {
  const int64_t K = w.in_features(), N = w.out_features();
  const auto codes = unpack_dim0(as_packed_words(w.qweight, "qweight"), w.bits, K);  // [K, N]
  auto zeros = unpack_dim0(as_packed_words(w.qzeros, "qzeros").t(), w.bits, N).t();  // [G, N]
  if (w.format == ZeroPointFormat::kGptqV1) zeros = zeros + 1;
  const auto g = w.g_idx.to(at::kLong);
  const auto scale = w.scales.index_select(0, g).to(at::kFloat);
  return (scale * (codes - zeros.index_select(0, g)).to(at::kFloat)).to(dtype);
}

at::Tensor lora_linear(const at::Tensor& x, const LoraProjection& p, const LoraDropout& dropout) {
  const auto dtype = x.scalar_type();
  auto result = at::matmul(x, dequantize(p.base, dtype));
  if (p.bias.defined()) result = result + p.bias.to(dtype);
  // The adapter path in the adapters' dtype, as peft's LoRA layer computes it: x cast to that
  // dtype, dropout and both products there, the sum taken in the wider of the two dtypes and
  // rounded to the activation dtype (docs/verification.md, "The baseline").
  const auto xa = dropout_input(x.to(p.lora_A.scalar_type()), dropout);
  const auto lora = at::matmul(at::matmul(xa, p.lora_A.t()), p.lora_B.t()) * p.scaling;
  return (result + lora).to(dtype);
}

at::Tensor lora_mlp(const at::Tensor& x, const LoraProjection& gate, const LoraProjection& up,
                    const LoraProjection& down, const LoraDropout& dropout_x,
                    const LoraDropout& dropout_h) {
  const auto h = at::silu(lora_linear(x, gate, dropout_x)) * lora_linear(x, up, dropout_x);
  return lora_linear(h, down, dropout_h);
}

at::Tensor decoder_layer(const at::Tensor& x, const DecoderLayer& l) {
  const int64_t batch = x.size(0), seq = x.size(1), hidden = x.size(2);
  const int64_t d = hidden / l.heads, half = d / 2, group = l.heads / l.kv_heads;
  const LoraDropout none;
  const auto norm = [&](const at::Tensor& t, const at::Tensor& w) {
    const auto t32 = t.to(at::kFloat);
    return w * (t32 / at::sqrt(t32.square().mean(-1, true) + l.norm_eps)).to(t.scalar_type());
  };
  // Rotation of the pairs (i, i + d/2) by position * theta^(-2i/d), written as
  // (a, b) -> (a cos - b sin, b cos + a sin) on the two halves.
  const auto f32 = x.options().dtype(at::kFloat);
  const auto angle = at::arange(l.position_offset, l.position_offset + seq, f32).unsqueeze(1) *
                     scaled_rope_frequencies(
                         l, at::exp(at::arange(half, f32) * (-2.0 * std::log(l.rope_theta) / d)));
  const auto c = angle.cos().to(x.scalar_type()), s = angle.sin().to(x.scalar_type());
  const auto rope = [&](const at::Tensor& t) {  // [batch, heads, seq, d]
    const auto a = t.narrow(-1, 0, half), b = t.narrow(-1, half, half);
    return at::cat({a * c - b * s, b * c + a * s}, -1);
  };
  const auto split = [&](const at::Tensor& t, int64_t n) {
    return t.view({batch, seq, n, d}).permute({0, 2, 1, 3});
  };
  const auto n1 = norm(x, l.input_norm);
  const auto q = rope(split(lora_linear(n1, l.q, none), l.heads));
  const auto k = rope(split(lora_linear(n1, l.k, none), l.kv_heads)).repeat_interleave(group, 1);
  const auto v = split(lora_linear(n1, l.v, none), l.kv_heads).repeat_interleave(group, 1);
  // Attention is not under test: the same ATen op as prod (with the key/value heads
  // repeated here), so the two differ only in the LoRA kernels and the code around them.
  // An explicit softmax attention made fp32 cases fail on seeds where only the two
  // attention algorithms' rounding differed.
  const auto attn =
      at::scaled_dot_product_attention(q, k, v, {}, 0.0, /*is_causal=*/true, attention_scale(l, d))
          .permute({0, 2, 1, 3})
          .reshape({batch, seq, hidden});
  const auto h = x + residual_branch(l, lora_linear(attn, l.o, none));
  return h + residual_branch(l, baseline::lora_mlp(norm(h, l.post_attention_norm), l.gate, l.up,
                                                   l.down, none, none));
}

}  // namespace gradscope::baseline

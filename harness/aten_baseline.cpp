#include "harness/aten_baseline.h"

#include <ATen/ATen.h>

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
  const auto lora = at::matmul(at::matmul(dropout_input(x, dropout), p.lora_A.to(dtype).t()),
                               p.lora_B.to(dtype).t()) *
                    p.scaling;
  return result + lora;
}

at::Tensor lora_mlp(const at::Tensor& x, const LoraProjection& gate, const LoraProjection& up,
                    const LoraProjection& down, const LoraDropout& dropout_x,
                    const LoraDropout& dropout_h) {
  const auto h = at::silu(lora_linear(x, gate, dropout_x)) * lora_linear(x, up, dropout_x);
  return lora_linear(h, down, dropout_h);
}

}  // namespace gradscope::baseline

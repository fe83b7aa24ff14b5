// The production ops as PyTorch operators in namespace `gradscope`, so a Python program can
// torch.ops.load_library("libgradscope_ops.so") and call them (and FSDP can wrap modules
// that do). Registered under CompositeImplicitAutograd: each operator is the C++ autograd
// function itself, so gradients reach x and every lora_A / lora_B as in C++, on whatever
// device the tensors live. A projection travels as a tensor list
// [qweight, qzeros, scales, g_idx, lora_A, lora_B] with an optional bias appended; packed
// words and g_idx may be int32 or a bit-exact float view (FSDP storage).
#include <torch/library.h>

#include <algorithm>
#include <array>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "gradscope/decoder_layer.h"
#include "gradscope/dequant.h"
#include "gradscope/lora_ops.h"
#include "gradscope/op_schemas.h"

namespace gradscope {
namespace {

ZeroPointFormat zero_format(const std::string& name) {
  try {
    return parse_zero_point_format(name);
  } catch (const std::invalid_argument& e) {
    TORCH_CHECK(false, "gradscope ops: zero_format: ", e.what());
  }
}

GptqWeight weight(const at::Tensor& qweight, const at::Tensor& qzeros, const at::Tensor& scales,
                  const at::Tensor& g_idx, int64_t bits, const std::string& format) {
  GptqWeight w;
  w.qweight = qweight;
  w.qzeros = qzeros;
  w.scales = scales;
  // g_idx may ride as a float view too (FSDP storage): its bytes are int32.
  w.g_idx = g_idx.is_floating_point() ? g_idx.contiguous().view(at::kInt) : g_idx;
  w.bits = static_cast<int>(bits);
  w.format = zero_format(format);
  return w;
}

LoraProjection projection(const char* op, const char* name, at::TensorList t, int64_t bits,
                          const std::string& format, double alpha, bool rslora) {
  TORCH_CHECK(t.size() == 6 || t.size() == 7, "gradscope.", op, ": ", name,
              " must be [qweight, qzeros, scales, g_idx, lora_A, lora_B] or those and bias, got ",
              t.size(), " tensors");
  LoraProjection p;
  p.base = weight(t[0], t[1], t[2], t[3], bits, format);
  p.lora_A = t[4];
  p.lora_B = t[5];
  if (t.size() == 7) p.bias = t[6];
  p.scaling = lora_scaling(alpha, p.lora_A.size(0), rslora);
  return p;
}

LoraDropout dropout(const std::optional<at::Tensor>& mask, double p) {
  LoraDropout d;
  if (mask.has_value() && mask->defined()) {
    TORCH_CHECK(p > 0 && p < 1, "gradscope ops: a dropout mask needs 0 < dropout_p < 1, got ", p);
    d.p = p;
    d.mask = *mask;
  }
  return d;
}

DequantLayout layout_of(const std::string& name) {
  if (name == "in_out") return DequantLayout::kInOut;
  if (name == "out_in") return DequantLayout::kOutIn;
  TORCH_CHECK(false, "gradscope.dequantize: layout must be \"in_out\" or \"out_in\", got \"", name,
              "\"");
}

at::Tensor dequantize_op(const at::Tensor& qweight, const at::Tensor& qzeros,
                         const at::Tensor& scales, const at::Tensor& g_idx, int64_t bits,
                         const std::string& format, at::ScalarType dtype,
                         const std::string& layout) {
  return dequantize_gptq(weight(qweight, qzeros, scales, g_idx, bits, format), dtype,
                         layout_of(layout));
}

at::Tensor lora_w_op(const at::Tensor& x, at::TensorList proj, int64_t bits,
                     const std::string& format, double alpha, bool rslora,
                     const std::optional<at::Tensor>& mask, double p) {
  return lora_w(x, projection("lora_w", "proj", proj, bits, format, alpha, rslora),
                dropout(mask, p));
}

std::vector<at::Tensor> lora_qkv_op(const at::Tensor& x, at::TensorList q, at::TensorList k,
                                    at::TensorList v, int64_t bits, const std::string& format,
                                    double alpha, bool rslora,
                                    const std::optional<at::Tensor>& mask, double p) {
  return lora_qkv(x, projection("lora_qkv", "q", q, bits, format, alpha, rslora),
                  projection("lora_qkv", "k", k, bits, format, alpha, rslora),
                  projection("lora_qkv", "v", v, bits, format, alpha, rslora), dropout(mask, p));
}

at::Tensor lora_mlp_op(const at::Tensor& x, at::TensorList gate, at::TensorList up,
                       at::TensorList down, int64_t bits, const std::string& format, double alpha,
                       bool rslora, const std::optional<at::Tensor>& mask_x,
                       const std::optional<at::Tensor>& mask_h, double p) {
  return lora_mlp(x, projection("lora_mlp", "gate", gate, bits, format, alpha, rslora),
                  projection("lora_mlp", "up", up, bits, format, alpha, rslora),
                  projection("lora_mlp", "down", down, bits, format, alpha, rslora),
                  dropout(mask_x, p), dropout(mask_h, p));
}

// The dictionary's value under each of `keys`, in order; a missing or unknown key is an error
// naming it and the keys expected.
template <class V, size_t N>
std::array<V, N> by_keys(const c10::Dict<std::string, V>& dict, const char* const (&keys)[N],
                         const char* argument) {
  std::string expected;
  for (const char* k : keys) expected += std::string(expected.empty() ? "" : ", ") + k;
  std::array<V, N> out;
  for (size_t i = 0; i < N; ++i) {
    const auto it = dict.find(keys[i]);
    TORCH_CHECK(it != dict.end(), "gradscope.decoder_layer: ", argument, " has no key '", keys[i],
                "' (expected ", expected, ")");
    out[i] = it->value();
  }
  for (const auto& entry : dict) {
    TORCH_CHECK(std::find_if(std::begin(keys), std::end(keys),
                             [&](const char* k) { return entry.key() == k; }) != std::end(keys),
                "gradscope.decoder_layer: ", argument, " has an unknown key '", entry.key(),
                "' (expected ", expected, ")");
  }
  return out;
}

// gradscope's own decoder layer over its own fused LoRA ops: every declared family's, the parts
// a family configures given as values (docs/model-families.md).
at::Tensor decoder_layer_op(const at::Tensor& x, const c10::Dict<std::string, at::Tensor>& norms,
                            const c10::Dict<std::string, c10::List<at::Tensor>>& projections,
                            int64_t bits, const std::string& format, double alpha, bool rslora,
                            const std::string& family, const std::string& rope_type,
                            const c10::Dict<std::string, int64_t>& sizes,
                            const c10::Dict<std::string, double>& values) {
  const auto& keys = kDecoderLayerKeys;
  const auto [input_norm, post_attention_norm] = by_keys(norms, keys.norms, "norms");
  const auto [heads, kv_heads, position_offset] = by_keys(sizes, keys.sizes, "sizes");
  const auto [rms_eps, rope_theta, scale, multiplier, factor, low, high, original] =
      by_keys(values, keys.values, "values");
  TORCH_CHECK(rope_type == "default" || rope_type == "llama3",
              "gradscope.decoder_layer: rope_type '", rope_type, "': expected default or llama3");
  const auto lists = by_keys(projections, keys.projections, "projections");
  const int64_t hidden = x.size(-1);
  TORCH_CHECK(input_norm.dim() == 1 && input_norm.size(0) == hidden &&
                  post_attention_norm.dim() == 1 && post_attention_norm.size(0) == hidden,
              "gradscope.decoder_layer: the norms must be [", hidden, "], got ", input_norm.sizes(),
              " and ", post_attention_norm.sizes());
  TORCH_CHECK(rms_eps > 0 && rope_theta > 0 && scale > 0 && multiplier > 0,
              "gradscope.decoder_layer: rms_eps, rope_theta, attention_scale and "
              "residual_multiplier must be positive, got ",
              rms_eps, ", ", rope_theta, ", ", scale, " and ", multiplier);
  TORCH_CHECK(heads > 0 && hidden % heads == 0 && (hidden / heads) % 2 == 0,
              "gradscope.decoder_layer: ", heads, " heads must split hidden ", hidden,
              " into even head widths (RoPE rotates pairs)");
  DecoderLayer l;
  l.family = family;
  l.input_norm = input_norm;
  l.post_attention_norm = post_attention_norm;
  l.norm_eps = rms_eps;
  LoraProjection* slots[] = {&l.q, &l.k, &l.v, &l.o, &l.gate, &l.up, &l.down};
  for (size_t i = 0; i < lists.size(); ++i) {
    *slots[i] = projection("decoder_layer", keys.projections[i], lists[i].vec(), bits, format,
                           alpha, rslora);
  }
  l.heads = heads;
  l.kv_heads = kv_heads;
  l.rope_theta = rope_theta;
  l.position_offset = position_offset;
  l.rope_type = rope_type;
  l.rope_factor = factor;
  l.rope_low_freq_factor = low;
  l.rope_high_freq_factor = high;
  l.rope_original_max_position = original;
  l.attention_scaling = scale;
  l.residual_multiplier = multiplier;
  return decoder_layer(x, l);
}

}  // namespace

bool op_registration_linked() {
  return true;
}

}  // namespace gradscope

TORCH_LIBRARY(gradscope, m) {
  for (const auto& op : gradscope::kOpSchemas) m.def(op.schema);
}

TORCH_LIBRARY_IMPL(gradscope, CompositeImplicitAutograd, m) {
  m.impl("dequantize", &gradscope::dequantize_op);
  m.impl("lora_w", &gradscope::lora_w_op);
  m.impl("lora_qkv", &gradscope::lora_qkv_op);
  m.impl("lora_mlp", &gradscope::lora_mlp_op);
  m.impl("decoder_layer", &gradscope::decoder_layer_op);
}

// A Llama-family decoder layer over the fused LoRA ops: RMSNorm -> LoRA_QKV -> RoPE -> causal
// grouped-query attention (ATen's scaled_dot_product_attention) -> LoRA_W (o_proj) ->
// residual -> RMSNorm -> LoRA_MLP -> residual, with the parts a family configures
// (docs/model-families.md): the scores' scale and a multiplier on each residual branch. The norms
// are frozen; gradients flow to the input and every adapter.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <string>
#include <vector>

#include "gradscope/lora_ops.h"

namespace gradscope {

struct DecoderLayer {
  std::string family = "llama";  // the declaration it was built from (docs/model-families.md)
  at::Tensor input_norm, post_attention_norm;  // RMSNorm weights [hidden]
  double norm_eps = 1e-5;
  LoraProjection q, k, v, o, gate, up, down;
  int64_t heads = 0, kv_heads = 0;
  double rope_theta = 10000.0;
  int64_t position_offset = 0;  // position of each sequence's first token
  // "llama3": Llama 3's scaling of the rotary frequencies by the four values below
  // (docs/model-families.md); "default": none.
  std::string rope_type = "default";
  double rope_factor = 1, rope_low_freq_factor = 1, rope_high_freq_factor = 4,
         rope_original_max_position = 8192;
  double attention_scaling = 0;    // the scores' scale; 0: 1 / sqrt(head_dim)
  double residual_multiplier = 1;  // h = x + m * attention(...), out = h + m * mlp(...)
};

// The fused LoRA ops a layer calls. Members left empty call this library's own; a harness sets
// them to another implementation's operators (docs/implementations.md).
struct LayerLoraOps {
  std::function<std::vector<at::Tensor>(const at::Tensor&, const LoraProjection&,
                                        const LoraProjection&, const LoraProjection&)>
      qkv;
  std::function<at::Tensor(const at::Tensor&, const LoraProjection&)> w;
  std::function<at::Tensor(const at::Tensor&, const LoraProjection&, const LoraProjection&,
                           const LoraProjection&)>
      mlp;
};

// x [batch, seq, hidden] -> [batch, seq, hidden]; position of token t is position_offset + t.
at::Tensor decoder_layer(const at::Tensor& x, const DecoderLayer& layer,
                         const LayerLoraOps& ops = {});

// Llama 3's scaling of inverse frequencies `f` (fp32, as Hugging Face computes it), where the
// layer's rope_type is "llama3"; `f` itself otherwise.
at::Tensor scaled_rope_frequencies(const DecoderLayer& layer, const at::Tensor& f);
// The scores' scale of a layer of head width `head_dim`.
double attention_scale(const DecoderLayer& layer, int64_t head_dim);
// A residual branch times the layer's multiplier, in its dtype as Hugging Face's Granite
// computes it (no product at all for 1).
at::Tensor residual_branch(const DecoderLayer& layer, const at::Tensor& branch);

// Hugging Face's LlamaRMSNorm: fp32 statistics, the result rounded to x's dtype, times weight.
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps);

}  // namespace gradscope

// A Llama decoder layer over the fused LoRA ops: RMSNorm -> LoRA_QKV -> RoPE -> causal
// grouped-query attention (ATen's scaled_dot_product_attention) -> LoRA_W (o_proj) ->
// residual -> RMSNorm -> LoRA_MLP -> residual. The norms are frozen; gradients flow to the
// input and every adapter.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <vector>

#include "gradscope/lora_ops.h"

namespace gradscope {

struct DecoderLayer {
  at::Tensor input_norm, post_attention_norm;  // RMSNorm weights [hidden]
  double norm_eps = 1e-5;
  LoraProjection q, k, v, o, gate, up, down;
  int64_t heads = 0, kv_heads = 0;
  double rope_theta = 10000.0;
  int64_t position_offset = 0;  // position of each sequence's first token
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

// Hugging Face's LlamaRMSNorm: fp32 statistics, the result rounded to x's dtype, times weight.
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps);

}  // namespace gradscope

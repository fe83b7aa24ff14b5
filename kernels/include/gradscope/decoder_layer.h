// A Llama decoder layer over the fused LoRA ops: RMSNorm -> LoRA_QKV -> RoPE -> causal
// grouped-query attention (ATen's scaled_dot_product_attention) -> LoRA_W (o_proj) ->
// residual -> RMSNorm -> LoRA_MLP -> residual. The norms are frozen; gradients flow to the
// input and every adapter.
#pragma once

#include <ATen/core/Tensor.h>

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

// x [batch, seq, hidden] -> [batch, seq, hidden]; position of token t is position_offset + t.
at::Tensor decoder_layer(const at::Tensor& x, const DecoderLayer& layer);

// Hugging Face's LlamaRMSNorm: fp32 statistics, the result rounded to x's dtype, times weight.
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps);

}  // namespace gradscope

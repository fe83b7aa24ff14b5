// fp64 reference of the rest of a Llama decoder layer: RMSNorm, rotary position embedding
// (Hugging Face's rotate-half pairing), causal grouped-query attention, and the whole
// layer composed with the LoRA references. Forward and hand-written backward on Eigen
// matrices with rows = tokens (batch-major: row b * seq + t); checked against finite
// differences in tests/layer_reference_test.cpp.
#pragma once

#include "reference/lora_reference.h"

namespace gradscope::reference {

// y = x / sqrt(mean(x^2) + eps) * weight, per row. The weight is frozen (no gradient).
struct RmsNorm {
  Eigen::RowVectorXd weight;
  double eps = 1e-6;
};
Matrix rmsnorm_forward(const Matrix& x, const RmsNorm& norm);
Matrix rmsnorm_backward(const Matrix& x, const Matrix& dy, const RmsNorm& norm);  // dx

// Llama 3's scaling of the rotary frequencies (rope_type "llama3"): frequencies whose
// wavelength exceeds original_max_position / low_freq_factor are divided by factor, those
// shorter than original_max_position / high_freq_factor kept, the ones between interpolated
// (docs/model-families.md).
struct RopeScaling {
  bool llama3 = false;
  double factor = 1, low_freq_factor = 1, high_freq_factor = 4, original_max_position = 8192;
};

// Shape of the attention inputs: q [batch * seq, heads * head_dim], k and v
// [batch * seq, kv_heads * head_dim]; query head h reads key/value head h / (heads / kv_heads).
struct AttentionShape {
  int64_t batch, seq, heads, kv_heads, head_dim;
  double rope_theta = 10000.0;
  int64_t position_offset = 0;  // position of a sequence's first token
  double scaling = 0;           // the scores' scale; 0: 1 / sqrt(head_dim)
  RopeScaling rope_scaling{};
};
double attention_scale(const AttentionShape& s);
// The rotary embedding's frequency of pair i: theta^(-2i / head_dim), scaled as s says.
double rope_frequency(const AttentionShape& s, int64_t i);

// Rotates each head's pairs (i, i + head_dim / 2) by position * rope_frequency(s, i);
// the position of row b * seq + t is position_offset + t. `heads` is the number of heads in x's
// columns.
Matrix rope_forward(const Matrix& x, const AttentionShape& s, int64_t heads);
// The transpose (inverse) rotation: dx from dy.
Matrix rope_backward(const Matrix& dy, const AttentionShape& s, int64_t heads);

// softmax(q k^T attention_scale(s) + causal mask) v per (batch, query head), by tiles of
// `tile_rows` query rows against the keys they may attend (the tile changes no value beyond
// fp64 rounding: the masked probabilities it skips are exact zeros).
inline constexpr int64_t kAttentionTileRows = 128;
Matrix attention_forward(const Matrix& q, const Matrix& k, const Matrix& v, const AttentionShape& s,
                         int64_t tile_rows = kAttentionTileRows);
struct AttentionGrads {
  Matrix dq, dk, dv;
};
AttentionGrads attention_backward(const Matrix& q, const Matrix& k, const Matrix& v,
                                  const Matrix& dout, const AttentionShape& s,
                                  int64_t tile_rows = kAttentionTileRows);

// One decoder layer: h = x + m o_proj(attention(rope(q), rope(k), v)) with q, k, v =
// qkv(rmsnorm1(x)); out = h + m mlp(rmsnorm2(h)), m the family's residual multiplier
// (docs/model-families.md). Dropout is off inside the layer.
struct Layer {
  RmsNorm input_norm, post_attention_norm;
  Projection q, k, v, o, gate, up, down;
  double residual_multiplier = 1.0;
};
struct LayerGrads {
  Matrix dx;
  ProjectionGrads q, k, v, o, gate, up, down;
};
Matrix layer_forward(const Matrix& x, const Layer& layer, const AttentionShape& s);
LayerGrads layer_backward(const Matrix& x, const Matrix& dy, const Layer& layer,
                          const AttentionShape& s);

// The forward's intermediate values the backward needs; keeping them lets a stack run
// each layer's forward once (the two-argument layer_backward recomputes them).
struct LayerTape {
  Matrix n1, q, k, v, qr, kr, attn, h, n2, out;  // out: the layer's output
  MlpTape mlp;
};
LayerTape layer_tape(const Matrix& x, const Layer& layer, const AttentionShape& s);
LayerGrads layer_backward(const LayerTape& tape, const Matrix& x, const Matrix& dy,
                          const Layer& layer, const AttentionShape& s);

}  // namespace gradscope::reference

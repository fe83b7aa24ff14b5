// The operator schemas of an implementation under test (docs/implementations.md, version 4):
// gradscope registers them in namespace `gradscope` (kernels/src/torch_library.cpp), and the
// harness requires them of any namespace chosen with --impl (harness/impl/impl_ops.cpp).
#pragma once

namespace gradscope {

inline constexpr int kOpSchemaVersion = 4;

struct OpSchema {
  const char* name;
  const char* schema;  // without the namespace
  // An implementation may leave it out: the cases that call it are then unsupported by it.
  bool optional = false;
};

inline constexpr OpSchema kOpSchemas[] = {
    {"dequantize",
     "dequantize(Tensor qweight, Tensor qzeros, Tensor scales, Tensor g_idx, int bits, "
     "str zero_format, ScalarType dtype, str layout=\"in_out\") -> Tensor"},
    {"lora_w",
     "lora_w(Tensor x, Tensor[] proj, int bits, str zero_format, float lora_alpha, "
     "bool use_rslora, Tensor? dropout_mask=None, float dropout_p=0.0) -> Tensor"},
    {"lora_qkv",
     "lora_qkv(Tensor x, Tensor[] q, Tensor[] k, Tensor[] v, int bits, str zero_format, "
     "float lora_alpha, bool use_rslora, Tensor? dropout_mask=None, float dropout_p=0.0) "
     "-> Tensor[]"},
    {"lora_mlp",
     "lora_mlp(Tensor x, Tensor[] gate, Tensor[] up, Tensor[] down, int bits, "
     "str zero_format, float lora_alpha, bool use_rslora, Tensor? dropout_x=None, "
     "Tensor? dropout_h=None, float dropout_p=0.0) -> Tensor"},
    // A whole decoder layer of a declared model family, its parts by name (the keys:
    // kDecoderLayerKeys): what a case with prod_calls = "decoder_layer" calls.
    {"decoder_layer",
     "decoder_layer(Tensor x, Dict(str, Tensor) norms, Dict(str, Tensor[]) projections, "
     "int bits, str zero_format, float lora_alpha, bool use_rslora, str family, "
     "str rope_type, Dict(str, int) sizes, Dict(str, float) values) -> Tensor",
     /*optional=*/true},
};

// The keys of decoder_layer's dictionaries, every one present in every call.
struct DecoderLayerKeys {
  const char* norms[2];
  const char* projections[7];
  const char* sizes[3];
  const char* values[8];
};
inline constexpr DecoderLayerKeys kDecoderLayerKeys = {
    {"input_layernorm", "post_attention_layernorm"},
    {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"},
    {"heads", "kv_heads", "position_offset"},
    // attention_scale: the scores' scale itself (1 / sqrt(head_dim) where the family fixes
    // none); residual_multiplier: 1 where the family has none; the rope_* four: Llama 3's
    // frequency scaling, read where rope_type is "llama3".
    {"rms_eps", "rope_theta", "attention_scale", "residual_multiplier", "rope_factor",
     "rope_low_freq_factor", "rope_high_freq_factor", "rope_original_max_position"},
};

// Defined beside the registration: a program that calls it links the object that registers
// the operators (a static archive's member is linked only when one of its symbols is used).
bool op_registration_linked();

}  // namespace gradscope

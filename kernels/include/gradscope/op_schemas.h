// The operator schemas of an implementation under test (docs/implementations.md, version 3):
// gradscope registers them in namespace `gradscope` (kernels/src/torch_library.cpp), and the
// harness requires them of any namespace chosen with --impl (harness/impl/impl_ops.cpp).
#pragma once

namespace gradscope {

inline constexpr int kOpSchemaVersion = 3;

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
    // A whole Llama-family decoder layer: what a case with prod_calls = "decoder_layer" calls.
    {"decoder_layer",
     "decoder_layer(Tensor x, Tensor input_norm, Tensor post_attention_norm, Tensor[] q, "
     "Tensor[] k, Tensor[] v, Tensor[] o, Tensor[] gate, Tensor[] up, Tensor[] down, int bits, "
     "str zero_format, float lora_alpha, bool use_rslora, int heads, int kv_heads, "
     "float rms_eps, float rope_theta, int position_offset) -> Tensor",
     /*optional=*/true},
};

// Defined beside the registration: a program that calls it links the object that registers
// the operators (a static archive's member is linked only when one of its symbols is used).
bool op_registration_linked();

}  // namespace gradscope

// GPTQ packed-weight format: quantize, pack, unpack, zero-point conventions.
// Layout facts follow docs/gptq-format.md; all functions here work on
// CPU tensors (format work happens once per layer, not per step) and return
// tensors on the device of their input.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>

namespace gradscope {

// `checkpoint_format`: v1 ("gptq") stores zero - 1, v2 ("gptq_v2") the zero itself.
enum class ZeroPointFormat { kGptqV1, kGptqV2 };

std::string to_string(ZeroPointFormat format);
// Throws std::invalid_argument naming the accepted spellings.
ZeroPointFormat parse_zero_point_format(const std::string& name);

bool is_supported_bits(int bits);  // 2, 3, 4, 8
inline int max_code(int bits) {
  return (1 << bits) - 1;
}
// in_features and out_features must be multiples of this to pack whole words: 32 / bits,
// and 32 for 3 bits (32 codes share 3 words).
inline int64_t packing_multiple(int bits) {
  return bits == 3 ? 32 : 32 / bits;
}

// Number of groups for in_features K: 1 for group_size -1, else ceil(K / group_size).
int64_t num_groups(int64_t in_features, int group_size);

struct QuantizeOptions {
  int bits = 4;
  int group_size = -1;
  bool sym = true;
  bool desc_act = false;
  bool static_groups = false;
  // Smallest zero the asymmetric quantizer may choose. v1 cannot store zero 0,
  // so a v1 writer asks for 1 instead of producing an unrepresentable layer.
  int min_zero = 0;
};

// The unpacked result of quantizing W^T [K, N].
struct QuantizedWeight {
  at::Tensor codes;   // int32 [K, N], 0..maxq
  at::Tensor zeros;   // int32 [G, N], true zero points
  at::Tensor scales;  // float32 [G, N]
  at::Tensor g_idx;   // int32 [K]
};

// Quantizes weight_t (W^T, float [K, N]) per group. With desc_act, `order`
// (int64 [K], a permutation of 0..K-1) is the order rows were quantized in and
// g_idx[order[i]] = i / group_size; static_groups keeps g_idx[k] = k / group_size.
QuantizedWeight quantize_gptq(const at::Tensor& weight_t, const at::Tensor& order,
                              const QuantizeOptions& options);

// Codes int32 [R, C] packed along dim 0 into int32 [R * bits / 32, C]: each
// column is a little-endian bitstream, row r at bits [r * bits, r * bits + bits).
at::Tensor pack_rows(const at::Tensor& codes, int bits);
at::Tensor unpack_rows(const at::Tensor& packed, int bits, int64_t rows);
// The same along dim 1: int32 [R, C] -> int32 [R, C * bits / 32] (qzeros layout).
at::Tensor pack_columns(const at::Tensor& codes, int bits);
at::Tensor unpack_columns(const at::Tensor& packed, int bits, int64_t columns);

// True zero points int32 [G, N] -> qzeros in the given convention. Throws
// std::invalid_argument if a zero cannot be stored (v1: zero 0; v2: zero maxq+1).
at::Tensor encode_zero_points(const at::Tensor& zeros, int bits, ZeroPointFormat format);
// qzeros -> true zero points int32 [G, N]. v1 adds 1 after masking, in a wide
// integer: a stored field of maxq means zero maxq + 1.
at::Tensor decode_zero_points(const at::Tensor& qzeros, int bits, int64_t columns,
                              ZeroPointFormat format);
// Re-encodes qzeros between conventions field by field (never by adding a packed
// constant, which carries into the next field). Throws like encode_zero_points.
at::Tensor convert_zero_points(const at::Tensor& qzeros, int bits, int64_t columns,
                               ZeroPointFormat from, ZeroPointFormat to);

// The tensors of one quantized linear layer, in checkpoint layout.
struct GptqWeight {
  at::Tensor qweight;  // int32 [K * bits / 32, N], or a float view of those words
  at::Tensor qzeros;   // int32 [G, N * bits / 32], or a float view of those words
  at::Tensor scales;   // fp16 or bf16 [G, N]
  at::Tensor g_idx;    // int32 [K]
  int bits = 4;
  ZeroPointFormat format = ZeroPointFormat::kGptqV1;

  int64_t in_features() const { return g_idx.size(0); }
  int64_t out_features() const { return scales.size(1); }
  // The same layer with every tensor on `device` (no copy for a tensor already there).
  GptqWeight to(at::Device device) const;
};

GptqWeight pack_gptq(const QuantizedWeight& quantized, int bits, ZeroPointFormat format,
                     at::ScalarType scales_dtype);

// Packed words may arrive as a bit-exact float view (FSDP storage: int32
// [R, C] viewed as fp32 [R, C] or fp16/bf16 [R, 2C]). Returns the int32 view,
// never a numeric conversion; `name` is used in error messages.
at::Tensor as_packed_words(const at::Tensor& words, const char* name);

// The inverse: a bit-exact float view of int32 words.
at::Tensor as_float_view(const at::Tensor& words, at::ScalarType view_dtype);

// Packed words as stored: int32 as they are, or as a bit-exact float view (as_float_view).
at::Tensor as_stored_words(const at::Tensor& words, at::ScalarType storage_dtype);

// A layer from its stored tensors, packed words viewed back to int32 (no copy).
GptqWeight packed_from_storage(const at::Tensor& qweight, const at::Tensor& qzeros,
                               const at::Tensor& scales, const at::Tensor& g_idx, int bits,
                               ZeroPointFormat format);

// Checks shapes, dtypes, devices and g_idx range; throws c10::Error whose
// message names the offending tensor and what was expected.
void validate_gptq_weight(const GptqWeight& weight);

}  // namespace gradscope

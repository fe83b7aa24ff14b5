// Seeded GPTQ layers for every case kind: the shared case-file fields, their shape
// rules, and quantization of a seeded weight.
#pragma once

#include <string>
#include <vector>

#include "gradscope/gptq_format.h"
#include "harness/spec/case_spec.h"

namespace gradscope {

struct GptqGenSpec {
  int bits;
  int group_size;
  bool desc_act;
  bool static_groups;
  bool sym;
  ZeroPointFormat format;
  at::ScalarType scales_dtype;

  explicit GptqGenSpec(const CaseSpec& spec);
  // "b4g128.act.v1.sym": the format part of a case id.
  std::string id_part() const;
};

// bits, group_size, desc_act, static_groups, sym, format, scales_dtype.
std::vector<FieldSpec> gptq_fields();

// Field-level rules (group_size 0, static_groups without desc_act).
void validate_gptq_fields(const CaseSpec& spec);
// Throws an InputError naming `k_field` or `n_field` (the case fields that set K and N)
// when a K x N layer cannot be packed at the case's bits.
void validate_gptq_shape(const CaseSpec& spec, int64_t K, int64_t N, const std::string& k_field,
                         const std::string& n_field);

// W^T [K, N] ~ N(0, 0.02^2) from stream `<prefix>weight`, act-order permutation from
// `<prefix>act_order`, quantized per spec; v1 asks the quantizer for zeros >= 1. The process
// keeps the layers it drew last (at most 2 GiB, or a sixteenth of its memory) and hands them
// out again as copies: the cases of a file that vary dtype or rank draw a layer once.
QuantizedWeight quantize_seeded_layer(uint64_t seed, const std::string& prefix, int64_t K,
                                      int64_t N, const GptqGenSpec& spec);
QuantizedWeight quantize_seeded_layer(uint64_t seed, const std::string& prefix, int64_t K,
                                      int64_t N, const QuantizeOptions& options);
// The same layer drawn afresh and not kept (a checkpoint's layers are each drawn once).
QuantizedWeight draw_seeded_layer(uint64_t seed, const std::string& prefix, int64_t K, int64_t N,
                                  const QuantizeOptions& options);
// Host memory the kept layers hold, and letting them go (before a case that needs it).
double kept_layer_bytes();
void drop_kept_layers();

// Overwrites a quantized layer's codes and zero points with the values that break careless
// decoders: codes 0 and maxq, a code with only its high bit or only its low bits set at rows
// 10 and 21 (where 3-bit codes straddle two words), and the extreme storable zero points of
// the spec's convention.
void plant_edge_values(QuantizedWeight& q, const GptqGenSpec& spec);

// Quantizer settings for a layer stored in `format`: v1 asks for zeros >= 1 (it cannot
// store a zero of 0).
QuantizeOptions quantize_options(int bits, int group_size, bool sym, bool desc_act,
                                 bool static_groups, ZeroPointFormat format);

}  // namespace gradscope

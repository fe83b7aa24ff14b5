// Draws of the fields several kinds share, for their KindDecl::sample (`gradscope sample`;
// the ranges and why: docs/coverage.md).
#pragma once

#include <cstdint>
#include <string>

#include "harness/generate/case_draw.h"

namespace gradscope::field_draws {

// One of the floating dtypes a case computes in (fp32, fp16, bf16).
const std::string& float_dtype(CaseDraw& d);

// A feature count in [lo, hi] that packs at `bits`: half the time an odd multiple of the
// format's smallest step (32 / bits, 32 at 3 bits), the tail of any tile larger than the step;
// otherwise a multiple of 32.
int64_t width(CaseDraw& d, int64_t bits, int64_t lo, int64_t hi);
// The GPTQ fields; returns the bit width, which the feature counts depend on.
int64_t gptq(CaseDraw& d);
// The LoRA fields: adapters, tokens (at most `max_tokens`), the input profile; `dropout` and a
// 2-D input only where the kind takes them.
void lora(CaseDraw& d, bool dropout, bool flat_input, int64_t max_tokens);
// The decoder-layer shape (layer, training).
void decoder_shape(CaseDraw& d, int64_t bits);
// The positions of a decoder case: with the unit profile, sometimes deep into a context.
void positions(CaseDraw& d);
// A decoder's RMSNorm epsilon and RoPE base, from a stream of their own: sometimes Hugging
// Face's Llama defaults (1e-6) or Llama 3's base (500000) instead of the fields' defaults.
void norm_and_rope(CaseDraw& d);
// Exact zeros in the activations, from a stream of their own.
void x_zeros(CaseDraw& d);

}  // namespace gradscope::field_draws

// A stack of seeded decoder layers of a declared model family as the layer and training kinds
// build it: the shape and family fields, their rules, each layer's projections and frozen
// norms, and the views prod, the baseline and the reference take of them.
#pragma once

#include <vector>

#include "gradscope/decoder_layer.h"
#include "harness/common/llama_projections.h"
#include "harness/kinds/lora_testbed.h"
#include "reference/layer_reference.h"

namespace gradscope::decoder_stack {

// hidden, intermediate, heads, kv_heads, layers, position_offset, max_position, rms_eps,
// rope_theta, the rope_type and its four values, family, attention_scaling, residual_multiplier.
std::vector<FieldSpec> fields();
// Heads dividing hidden into even widths, kv_heads dividing heads, GPTQ shapes, no
// dropout (it is checked per op), batch >= 1, a declared family configuring every part the
// case gives a value.
void validate(const CaseSpec& spec, const std::string& kind);

struct Dims {
  int64_t hidden, intermediate, heads, kv_heads, layers;
  int64_t position_offset, max_position;
  double rms_eps, rope_theta, attention_scaling, residual_multiplier;
  std::string family;
  reference::RopeScaling rope_scaling;
  explicit Dims(const CaseSpec& spec);
  // "h128i256.q4kv2.L2", then ".pos<offset>", ".ctx<max_position>", ".eps<rms_eps>" and
  // ".theta<rope_theta>", ".<family>", ".as<attention_scaling>" and ".rm<residual_multiplier>"
  // where not the default
  std::string id_part() const;
  // The attention's shape and its tokens' first position (by the input profile).
  reference::AttentionShape attention(const lora_testbed::Config& c) const;
};

struct StackLayer {
  // In the order of kLlamaProjections; their fp64 `ref` parts are moved into `ref` (a layer's
  // weights are gigabytes at 70B shapes) and left empty here.
  std::vector<lora_testbed::Projection> projections;
  at::Tensor input_norm, post_attention_norm;  // case dtype, host
  reference::Layer ref;
};
// The reference's fp64 copies of every layer's seven projections (with the activations on
// their sides) and of one layer's attention probabilities [batch, heads, seq, seq].
double stack_reference_bytes(const CaseSpec& spec);

// Every layer's projections and norms by their paths in a Hugging Face decoder layer, and their
// streams.
std::vector<CasePart> parts(const CaseSpec& spec);

// Layer i draws from streams "layers.<i + 1>.*".
std::vector<StackLayer> make_stack(const lora_testbed::Config& c, const Dims& d);

// Prod's or the baseline's copy of one layer, on the case device.
DecoderLayer device_layer(const lora_testbed::Config& c, const Dims& d, const StackLayer& layer,
                          lora_testbed::Role role, int64_t position_offset);
// Why what depends on a layer's attention cannot be judged (its scores err past
// reference::kScoreSigmaFirstOrder), naming `layer`, the score and its error; empty if it can.
std::string attention_beyond_model(const reference::ScoreError& e, const std::string& layer,
                                   const lora_testbed::Config& c);

// A device layer's seven projections by name, for backward().
std::vector<lora_testbed::NamedProjection> named_projections(const DecoderLayer& layer);

}  // namespace gradscope::decoder_stack

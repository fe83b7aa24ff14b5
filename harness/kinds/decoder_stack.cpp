#include "harness/kinds/decoder_stack.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <utility>

#include "harness/common/input_error.h"
#include "harness/common/tensor_bridge.h"
#include "harness/generate/seeded_streams.h"
#include "harness/spec/model_family.h"

namespace gradscope::decoder_stack {

namespace tb = lora_testbed;

constexpr double kDefaultRmsEps = 1e-5, kDefaultRopeTheta = 10000.0;
// Llama 3.1's values (its config.json rope_scaling): a case of rope_type llama3 that gives none.
constexpr reference::RopeScaling kLlama3Rope{true, 8.0, 1.0, 4.0, 8192.0};
constexpr std::pair<const char*, double> kRopeFields[] = {
    {"rope_factor", kLlama3Rope.factor},
    {"rope_low_freq_factor", kLlama3Rope.low_freq_factor},
    {"rope_high_freq_factor", kLlama3Rope.high_freq_factor},
    {"rope_original_max_position", kLlama3Rope.original_max_position}};

// Text that reads back as v, so two values never share an id: a whole number in digits
// (500000), anything else the shortest round trip (1e-06).
std::string short_number(double v) {
  if (v == std::floor(v) && std::abs(v) < 1e15) return std::to_string(static_cast<int64_t>(v));
  char buf[32];
  const auto end = std::to_chars(buf, buf + sizeof buf, v).ptr;
  return std::string(buf, end);
}

std::vector<FieldSpec> fields() {
  return {
      FieldSpec("hidden", FieldType::kInt, int64_t{128}, "hidden size = heads * head_dim")
          .in_range(1, 1 << 16),
      FieldSpec("intermediate", FieldType::kInt, int64_t{256}, "MLP intermediate size")
          .in_range(1, 1 << 17),
      FieldSpec("heads", FieldType::kInt, int64_t{4}, "query heads").in_range(1, 1024),
      FieldSpec("kv_heads", FieldType::kInt, int64_t{2}, "key/value heads (GQA)").in_range(1, 1024),
      FieldSpec("layers", FieldType::kInt, int64_t{2}, "decoder layers in the stack")
          .in_range(1, 128),
      FieldSpec("position_offset", FieldType::kInt, int64_t{0},
                "position of each sequence's first token (profile unit; realistic draws it)")
          .in_range(0, 1 << 24),
      FieldSpec("max_position", FieldType::kInt, int64_t{4096},
                "the model's context: realistic positions stay below it")
          .in_range(1, 1 << 24),
      FieldSpec("rms_eps", FieldType::kFloat, kDefaultRmsEps,
                "RMSNorm epsilon (Hugging Face's rms_norm_eps)")
          .in_range(1e-12, 1),
      FieldSpec("rope_theta", FieldType::kFloat, kDefaultRopeTheta,
                "RoPE base (default rotary embedding; Llama 3 uses 500000)")
          .in_range(1, 1e12),
      FieldSpec("rope_type", FieldType::kString, std::string("default"),
                "the rotary embedding: default, or llama3 (Llama 3.1/3.2's frequency scaling by "
                "the four rope_* values)")
          .one_of({report::SpecValue(std::string("default")),
                   report::SpecValue(std::string("llama3"))}),
      FieldSpec("rope_factor", FieldType::kFloat, kLlama3Rope.factor,
                "llama3: the factor long wavelengths' frequencies are divided by")
          .in_range(1, 1e4),
      FieldSpec("rope_low_freq_factor", FieldType::kFloat, kLlama3Rope.low_freq_factor,
                "llama3: wavelengths past original_max_position / it are scaled whole")
          .in_range(1e-3, 1e4),
      FieldSpec("rope_high_freq_factor", FieldType::kFloat, kLlama3Rope.high_freq_factor,
                "llama3: wavelengths below original_max_position / it are kept")
          .in_range(1e-3, 1e4),
      FieldSpec("rope_original_max_position", FieldType::kFloat, kLlama3Rope.original_max_position,
                "llama3: the context the model was pretrained at (original_max_position_"
                "embeddings)")
          .in_range(1, 1 << 24),
      FieldSpec("family", FieldType::kString, std::string("llama"),
                "the model family whose decoder layer this is (families/<name>.toml)"),
      FieldSpec("attention_scaling", FieldType::kFloat, 0.0,
                "the attention scores' scale; 0: 1 / sqrt(head_dim) (a family that configures "
                "it, e.g. Granite's attention_multiplier)")
          .in_range(0, 1e3),
      FieldSpec("residual_multiplier", FieldType::kFloat, 1.0,
                "each block's output times it before its residual add (a family that "
                "configures it, e.g. Granite's)")
          .in_range(1e-6, 1e3),
  };
}

namespace {

// The case's values of the parts its family configures; a value for a part the family does not
// configure would judge its layer against another layer.
void validate_family(const CaseSpec& s) {
  const auto name = s.get_string("family");
  model_families();  // a malformed declaration is an error of its own file
  const ModelFamily* family = nullptr;
  try {
    family = &model_family(name);
  } catch (const InputError& e) {
    throw_field_error(s, "family", std::string("is not declared: ") + e.what());
  }
  const auto rope_type = s.get_string("rope_type");
  const auto& types = family->rope.types;
  if (std::find(types.begin(), types.end(), rope_type) == types.end()) {
    throw_field_error(s, "rope_type",
                      "'" + rope_type + "' is not a rope_type of family " + name + " (" +
                          family->file + ", rope.types)");
  }
  if (!family->attention.scaling.configured() && s.get_float("attention_scaling") != 0.0) {
    throw_field_error(s, "attention_scaling",
                      "must be 0 for family " + name +
                          ": it scales the scores by 1 / "
                          "sqrt(head_dim) (" +
                          family->file + ", attention.scaling = \"default\")");
  }
  if (!family->residual.multiplier.configured() && s.get_float("residual_multiplier") != 1.0) {
    throw_field_error(s, "residual_multiplier",
                      "must be 1 for family " + name + ": its residual adds are plain (" +
                          family->file + ", residual.multiplier = \"default\")");
  }
}

}  // namespace

void validate(const CaseSpec& s, const std::string& kind) {
  tb::validate(s);
  validate_family(s);
  if (s.get_string("rope_type") == "default") {
    for (const auto& [field, default_value] : kRopeFields) {
      if (s.get_float(field) != default_value) {
        throw_field_error(s, field, "is read only with rope_type = \"llama3\"");
      }
    }
  } else if (s.get_float("rope_high_freq_factor") <= s.get_float("rope_low_freq_factor")) {
    throw_field_error(s, "rope_high_freq_factor",
                      "must exceed rope_low_freq_factor (Llama 3's smoothing divides by their "
                      "difference)");
  }
  const int64_t hidden = s.get_int("hidden"), heads = s.get_int("heads"),
                kv = s.get_int("kv_heads"), inter = s.get_int("intermediate");
  tb::validate_heads(s, /*rope=*/true);
  if (s.get_float("dropout") != 0.0) {
    throw_field_error(s, "dropout", "must be 0 for kind " + kind + " (dropout is checked per op)");
  }
  if (s.get_int("seq") < 2) {
    throw_field_error(s, "seq",
                      "must be at least 2 for kind " + kind +
                          ": with one token a sequence attends only to itself, and the q_proj "
                          "and k_proj gradients are identically zero (nothing to check)");
  }
  if (s.get_int("batch") == 0) {
    throw_field_error(s, "batch",
                      "must be at least 1 for kind " + kind + " (attention needs [batch, seq])");
  }
  if (s.get_string("profile") == "realistic" && s.get_int("position_offset") != 0) {
    throw_field_error(s, "position_offset",
                      "must be 0 with profile realistic (the profile draws the offset)");
  }
  if (s.get_string("profile") == "realistic" && s.get_int("seq") > s.get_int("max_position")) {
    throw_field_error(s, "max_position",
                      "must be at least seq " + std::to_string(s.get_int("seq")) +
                          " with profile realistic, got " +
                          std::to_string(s.get_int("max_position")));
  }
  validate_gptq_shape(s, hidden, hidden, "hidden", "hidden");
  validate_gptq_shape(s, hidden, hidden / heads * kv, "hidden", "kv_heads");
  validate_gptq_shape(s, hidden, inter, "hidden", "intermediate");
  validate_gptq_shape(s, inter, hidden, "intermediate", "hidden");
}

Dims::Dims(const CaseSpec& s)
    : hidden(s.get_int("hidden")),
      intermediate(s.get_int("intermediate")),
      heads(s.get_int("heads")),
      kv_heads(s.get_int("kv_heads")),
      layers(s.get_int("layers")),
      position_offset(s.get_int("position_offset")),
      max_position(s.get_int("max_position")),
      rms_eps(s.get_float("rms_eps")),
      rope_theta(s.get_float("rope_theta")),
      attention_scaling(s.get_float("attention_scaling")),
      residual_multiplier(s.get_float("residual_multiplier")),
      family(s.get_string("family")),
      rope_scaling{s.get_string("rope_type") == "llama3", s.get_float("rope_factor"),
                   s.get_float("rope_low_freq_factor"), s.get_float("rope_high_freq_factor"),
                   s.get_float("rope_original_max_position")} {}

std::string Dims::id_part() const {
  std::string id = "h" + std::to_string(hidden) + "i" + std::to_string(intermediate) + ".q" +
                   std::to_string(heads) + "kv" + std::to_string(kv_heads) + ".L" +
                   std::to_string(layers);
  if (position_offset != 0) id += ".pos" + std::to_string(position_offset);
  if (max_position != 4096) id += ".ctx" + std::to_string(max_position);
  if (rms_eps != kDefaultRmsEps) id += ".eps" + short_number(rms_eps);
  if (rope_theta != kDefaultRopeTheta) id += ".theta" + short_number(rope_theta);
  if (rope_scaling.llama3) {
    id += ".llama3";
    const double values[] = {rope_scaling.factor, rope_scaling.low_freq_factor,
                             rope_scaling.high_freq_factor, rope_scaling.original_max_position};
    const char* tags[] = {".rf", ".rl", ".rh", ".ro"};
    for (int i = 0; i < 4; ++i) {
      if (values[i] != kRopeFields[i].second) id += tags[i] + short_number(values[i]);
    }
  }
  if (family != "llama") id += "." + family;
  if (attention_scaling != 0.0) id += ".as" + short_number(attention_scaling);
  if (residual_multiplier != 1.0) id += ".rm" + short_number(residual_multiplier);
  return id;
}

reference::AttentionShape Dims::attention(const tb::Config& c) const {
  reference::AttentionShape shape{c.batch, c.seq, heads, kv_heads, hidden / heads};
  shape.position_offset = first_position(c.seed, c.inputs, position_offset, max_position, c.seq);
  shape.rope_theta = rope_theta;
  shape.scaling = attention_scaling;
  shape.rope_scaling = rope_scaling;
  return shape;
}

// The streams of a layer's norms, by the names decoder_layer's `norms` takes them
// (kDecoderLayerKeys).
namespace {
constexpr std::pair<const char*, const char*> kNormStreams[] = {
    {"input_layernorm", "input_norm"}, {"post_attention_layernorm", "post_attention_norm"}};
}  // namespace

std::vector<CasePart> parts(const CaseSpec& spec) {
  std::vector<CasePart> out;
  for (int64_t i = 1; i <= spec.get_int("layers"); ++i) {
    const std::string layer = "layers." + std::to_string(i) + ".";
    for (const auto& p : kLlamaProjections) {
      out.push_back(
          {std::string(p.module) + "." + std::string(p.name), layer + std::string(p.name), i});
    }
    for (const auto& [path, stream] : kNormStreams) out.push_back({path, layer + stream, i});
  }
  return out;
}

double stack_reference_bytes(const CaseSpec& spec) {
  const Dims d(spec);
  const int64_t kv_out = d.hidden / d.heads * d.kv_heads;
  const auto projections = [&](auto bytes) {
    return 2 * bytes(d.hidden, d.hidden) + 2 * bytes(d.hidden, kv_out) +
           2 * bytes(d.hidden, d.intermediate) + bytes(d.intermediate, d.hidden);
  };
  // Every layer's weights are held by the stack; one layer's activations at a time.
  const double weights = projections([](int64_t in, int64_t out) { return 8.0 * in * out; });
  const double one_layer = projections(
      [&](int64_t in, int64_t out) { return tb::reference_projection_bytes(spec, in, out); });
  const double batch = static_cast<double>(std::max<int64_t>(1, spec.get_int("batch")));
  const double seq = static_cast<double>(spec.get_int("seq"));
  return double(d.layers - 1) * weights + one_layer + 8.0 * batch * double(d.heads) * seq * seq;
}

std::vector<StackLayer> make_stack(const tb::Config& c, const Dims& d) {
  const int64_t kv_out = d.hidden / d.heads * d.kv_heads;
  std::vector<StackLayer> stack(d.layers);
  for (int64_t i = 0; i < d.layers; ++i) {
    auto& L = stack[i];
    for (const auto& projection : kLlamaProjections) {
      const std::string name(projection.name);
      const bool kv = name == "k_proj" || name == "v_proj";
      const int64_t in = name == "down_proj" ? d.intermediate : d.hidden;
      const int64_t out = name == "gate_proj" || name == "up_proj" ? d.intermediate
                          : kv                                     ? kv_out
                                                                   : d.hidden;
      L.projections.push_back(tb::make_projection(c, name, in, out, i + 1));
      member(L.ref, name) = std::move(L.projections.back().ref);
    }
    const auto norm = [&](const char* name, reference::RmsNorm& ref) {
      const std::string stream = "layers." + std::to_string(i + 1) + "." + name;
      const auto given =
          c.tensors() ? c.tensors()->floating(stream, {d.hidden}, c.dtype) : std::nullopt;
      auto w = given ? *given : (normal_tensor(c.seed, stream, {d.hidden}, 0.1) + 1.0).to(c.dtype);
      ref = {bridge::to_matrix(w.to(at::kDouble).view({1, d.hidden})).row(0), d.rms_eps};
      return w;
    };
    L.input_norm = norm(kNormStreams[0].second, L.ref.input_norm);
    L.post_attention_norm = norm(kNormStreams[1].second, L.ref.post_attention_norm);
    L.ref.residual_multiplier = d.residual_multiplier;
  }
  return stack;
}

DecoderLayer device_layer(const tb::Config& c, const Dims& d, const StackLayer& L, tb::Role role,
                          int64_t position_offset) {
  DecoderLayer layer;
  layer.position_offset = position_offset;
  // Copies even on the CPU (where .to would hand back the same tensor): a prod that writes
  // into its norm weights must not move the baseline's, as with the packed words.
  layer.input_norm = L.input_norm.to(c.device, /*non_blocking=*/false, /*copy=*/true);
  layer.post_attention_norm =
      L.post_attention_norm.to(c.device, /*non_blocking=*/false, /*copy=*/true);
  layer.norm_eps = d.rms_eps;
  layer.rope_theta = d.rope_theta;
  layer.heads = d.heads;
  layer.kv_heads = d.kv_heads;
  layer.family = d.family;
  if (d.rope_scaling.llama3) {
    layer.rope_type = "llama3";
    layer.rope_factor = d.rope_scaling.factor;
    layer.rope_low_freq_factor = d.rope_scaling.low_freq_factor;
    layer.rope_high_freq_factor = d.rope_scaling.high_freq_factor;
    layer.rope_original_max_position = d.rope_scaling.original_max_position;
  }
  layer.attention_scaling = d.attention_scaling;
  layer.residual_multiplier = d.residual_multiplier;
  for (const auto& p : L.projections) member(layer, p.name) = p.of(role);
  return layer;
}

std::string attention_beyond_model(const reference::ScoreError& e, const std::string& layer,
                                   const tb::Config& c) {
  if (e.sigma <= reference::kScoreSigmaFirstOrder) return "";  // a NaN is past it
  char buf[400];
  std::snprintf(
      buf, sizeof buf,
      "%s's attention is past the floor's model: a careful %s implementation's "
      "score at batch %lld, query head %lld, query %lld, key %lld (exact value %.6g) errs "
      "by sigma %.4g > %.4g, where the model's first order no longer holds "
      "(docs/verification.md, \"What the model approximates\"): the case, not the "
      "kernel",
      layer.c_str(), bridge::dtype_name(c.dtype).c_str(), static_cast<long long>(e.batch),
      static_cast<long long>(e.head), static_cast<long long>(e.query),
      static_cast<long long>(e.key), e.score, e.sigma, reference::kScoreSigmaFirstOrder);
  return buf;
}

std::vector<tb::NamedProjection> named_projections(const DecoderLayer& layer) {
  std::vector<tb::NamedProjection> named;
  for (const auto& p : kLlamaProjections) {
    named.push_back({std::string(p.name), &member(layer, p.name)});
  }
  return named;
}

}  // namespace gradscope::decoder_stack

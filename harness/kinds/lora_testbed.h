// The testbed of the LoRA op family (lora_w, qkv, mlp): shared case fields, seeded
// projections and inputs as each implementation sees them, and the per-tensor checks.
// Every generated tensor is drawn in fp64 from its own stream, rounded once to the
// dtype prod and the baseline use, and the reference gets exactly those rounded values.
#pragma once

#include <ATen/core/Tensor.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "gradscope/lora_ops.h"
#include "harness/engine/case_kind.h"
#include "harness/generate/gptq_layer_gen.h"
#include "harness/generate/input_profiles.h"
#include "harness/impl/impl_ops.h"
#include "harness/kinds/case_tensors.h"
#include "harness/verdict/compare.h"
#include "reference/lora_reference.h"
#include "reference/rounding_noise.h"

namespace gradscope::lora_testbed {

// Which of the two implementations a copy of the case's tensors belongs to: the one under
// test (prod) or the unfused baseline (base).
enum class Role { kProd, kBase };

// The reference's fp64 copy of a projection [in, out] and of the activations and gradients
// on its two sides over the case's tokens: what any LoRA case holds at least, per projection.
double reference_projection_bytes(const CaseSpec& spec, int64_t in, int64_t out);
int64_t case_tokens(const CaseSpec& spec);

// rank, alpha, rslora, dropout, bias, adapter_dtype, batch, seq, the profile fields, then the
// GPTQ fields.
std::vector<FieldSpec> fields();
void validate(const CaseSpec& spec);
// heads divides hidden (into heads of even width where RoPE rotates pairs of features) and
// kv_heads divides heads (grouped-query attention).
void validate_heads(const CaseSpec& spec, bool rope);

struct Config {
  at::ScalarType dtype;
  at::ScalarType adapter_dtype;
  at::Device device;
  uint64_t seed;
  int64_t rank;
  double alpha;
  bool rslora;
  double dropout;
  bool bias;
  int64_t batch;  // 0: 2-D input [seq, features]
  int64_t seq;
  GptqGenSpec gptq;
  ProfileSpec inputs;
  std::string checkpoint;    // empty: seeded layers; else base weights from this checkpoint
  int64_t layer;             // the checkpoint's decoder layer
  std::string tensors_path;  // field `tensors`: empty, or a file of tensors for the draws

  explicit Config(const CaseSpec& spec);
  // The LoRA scaling from the case's fields, derived here for the baseline and the reference
  // (alpha / r, or alpha / sqrt(r) for rsLoRA; docs/lora-math.md). Prod's comes from the
  // production library's own lora_scaling(): a wrong formula there cannot move the judges.
  double scaling() const;
  // What the implementation under test is given to derive its own scaling from.
  impl::LoraArgs lora_args() const { return {alpha, rslora}; }
  int64_t tokens() const { return batch > 0 ? batch * seq : seq; }
  std::vector<int64_t> shape(int64_t features) const;
  // The `tensors` file, mapped on first use (a case id or a validation never opens it), or the
  // tensors a host program gave the case; null when the case has neither.
  const CaseTensors* tensors() const;
  // ".t2x32.r8.b4g128.v1.sym[.p0.1][.bias][.a32][.rslora][.adapter-bf16][.realistic].s1"
  std::string id_suffix() const;

 private:
  std::shared_ptr<const GivenTensors> given_tensors_;
  mutable std::shared_ptr<const CaseTensors> tensors_;
};

// The case takes tensors from a file or from a host program (field `tensors`, given_tensors).
bool has_tensors(const CaseSpec& spec);

// The formats a careful implementation of the case computes in (the rounding-noise model of
// the floor), derived from the case's dtypes, and the name of each.
reference::Format format_of(at::ScalarType dtype);
reference::Precision precision(const Config& c);
// The format adapters' gradients are computed in: the wider of activation and adapter dtypes.
at::ScalarType adapter_compute_dtype(const Config& c);

// One projection: frozen GPTQ base and adapters, once for prod and once (separate
// autograd leaves, same values) for the baseline, and the reference's fp64 copy.
struct Projection {
  std::string name;  // Hugging Face name: q_proj ... down_proj
  LoraProjection prod;
  LoraProjection base;
  reference::Projection ref;
  const LoraProjection& of(Role role) const { return role == Role::kProd ? prod : base; }
};
// A projection's generated tensors (packed base, adapters, bias) under `prefix` + ".qweight" ...,
// the names a `tensors` file takes; host tensors.
void append_generated(std::vector<std::pair<std::string, at::Tensor>>& out,
                      const std::string& prefix, const Projection& p);

// After a case's draws: every tensor of the `tensors` file was taken, else InputError.
void require_all_tensors_taken(const Config& c, const std::string& case_id);

// `layer` > 0 (1-based position in a stack of layers) draws from streams
// "layers.<layer>.<name>..." and reads the checkpoint's layer c.layer + layer - 1, so a stack
// starts at the case's `layer`; layer 0 keeps the single-op kinds' streams and reads c.layer.
Projection make_projection(const Config& c, const std::string& name, int64_t in, int64_t out,
                           int64_t layer = 0);

// An activation or output gradient: prod's and the baseline's copies (leaves that
// require grad when asked) and the reference's values [tokens, features].
struct Activation {
  at::Tensor prod, base;
  reference::Matrix ref;
  const at::Tensor& of(Role role) const { return role == Role::kProd ? prod : base; }
};
// An activation drawn by the case's input profile.
Activation make_activation(const Config& c, const std::string& name, int64_t features,
                           bool requires_grad);
// An output gradient drawn by the case's input profile (never requires grad).
Activation make_output_grad(const Config& c, const std::string& name, int64_t features);

struct Dropout {
  LoraDropout device;
  reference::Dropout ref;
};
// Bernoulli(1 - p) mask from stream `name` over [tokens, features].
Dropout make_dropout(const Config& c, const std::string& name, int64_t features);

// One projection's adapter gradients as an implementation returns them.
struct AdapterGrads {
  at::Tensor dA, dB;
};

// One compared tensor as the three implementations computed it, and the variance of a
// careful implementation's rounding error at each element (the floor's model).
struct Compared {
  at::Tensor prod, base;
  const reference::Matrix& ref;
  const reference::Matrix& variance;
};

// Collects the ratio-rule checks of one case under <id>/layer0/<module>/. The noise model
// that produced the variances says which of its intermediates left the activation range.
class Checks {
 public:
  Checks(const Config& c, std::string prefix, bool keep_tensors,
         const reference::RoundingNoise& noise);
  // `projection`/`tensor`, e.g. ("q_proj", "output"), an activation-dtype tensor; ref is
  // reshaped to prod's expected shape `shape` so a wrongly shaped prod fails.
  void add(const std::string& projection, const std::string& tensor, const Compared& t,
           at::IntArrayRef shape);
  // lora_A.grad and lora_B.grad, expected in the adapter dtype.
  void add_adapter_grads(const Projection& p, const AdapterGrads& prod, const AdapterGrads& base,
                         const reference::ProjectionGrads& ref,
                         const reference::ProjectionGradsNoise& noise);
  // A tensor expected in another dtype or on another device (e.g. fp32 losses on the host).
  void add_as(const std::string& path, const Compared& t, at::IntArrayRef shape,
              const Expected& expected, ErrorStatistic statistic = ErrorStatistic::kMaxAbs);
  // An intermediate of the careful implementation that leaves its format's range, found by
  // the runner itself (e.g. a rank's partial gradient): a prod that overflows with it makes the
  // case out of range. The first one noted stands.
  void note_model_overflow(const std::string& what, const std::string& format);
  // Where the floor's model does not hold for what this block checks (an attention past
  // reference::kScoreSigmaFirstOrder): every check added after is reported but not judged.
  void note_not_judged(const std::string& why) { not_judged_ = why; }
  std::vector<report::Check> take() { return std::move(checks_); }

 private:
  const Config& config_;
  std::string prefix_;
  bool keep_tensors_;
  std::string model_overflow_, model_format_, not_judged_;
  std::vector<report::Check> checks_;
};

// For dumps: the generated inputs of a case (x, output gradients, initial adapters,
// dropout masks), recorded only when the run keeps tensors.
void keep_inputs(CaseResult& out, bool keep_tensors, const Activation& x,
                 const std::vector<std::pair<std::string, const Activation*>>& output_grads,
                 const std::vector<const Projection*>& projections,
                 const std::vector<std::pair<std::string, const Dropout*>>& dropouts);

// A projection's copy for one implementation, under its name.
struct NamedProjection {
  std::string name;
  const LoraProjection* projection;
};
// The projections of one implementation.
std::vector<NamedProjection> copies_of(const std::vector<const Projection*>& projections,
                                       Role role);

// The gradients one implementation returns: of its input, and of each projection's adapters
// by projection name.
struct Gradients {
  at::Tensor dx;
  std::map<std::string, AdapterGrads> adapters;
  const AdapterGrads& of(const std::string& projection) const;
};
// Backpropagates `grad_outputs` from `outputs` to x (when it requires grad) and every adapter
// of `projections`.
Gradients backward(const std::vector<at::Tensor>& outputs,
                   const std::vector<at::Tensor>& grad_outputs, const at::Tensor& x,
                   const std::vector<NamedProjection>& projections);

}  // namespace gradscope::lora_testbed

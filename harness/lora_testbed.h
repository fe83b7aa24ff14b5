// The testbed of the LoRA op family (lora_w, qkv, mlp): shared case fields, seeded
// projections and inputs as each implementation sees them, and the per-tensor checks.
// Every generated tensor is drawn in fp64 from its own stream, rounded once to the
// dtype prod and the baseline use, and the reference gets exactly those rounded values.
#pragma once

#include <ATen/core/Tensor.h>

#include <chrono>
#include <string>
#include <vector>

#include "gradscope/lora_ops.h"
#include "harness/case_runner.h"
#include "harness/gptq_layer_gen.h"
#include "reference/lora_reference.h"

namespace gradscope::lora_testbed {

// rank, alpha, rslora, dropout, bias, adapter_dtype, batch, seq, then the GPTQ fields.
std::vector<FieldSpec> fields();
void validate(const CaseSpec& spec);

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
  std::string checkpoint;  // empty: seeded layers; else base weights from this checkpoint
  int64_t layer;           // the checkpoint's decoder layer

  explicit Config(const CaseSpec& spec);
  double scaling() const;
  int64_t tokens() const { return batch > 0 ? batch * seq : seq; }
  std::vector<int64_t> shape(int64_t features) const;
  // ".t2x32.r8.b4g128.v1.sym[.p0.1][.bias][.a32][.rslora][.adapter-bf16].s1"
  std::string id_suffix() const;
};

// One projection: frozen GPTQ base and adapters, once for prod and once (separate
// autograd leaves, same values) for the baseline, and the reference's fp64 copy.
struct Projection {
  std::string name;  // Hugging Face name: q_proj ... down_proj
  LoraProjection prod;
  LoraProjection base;
  reference::Projection ref;
};
// `layer` > 0 (a stack of layers) draws from streams "layers.<layer>.<name>..." and reads
// the checkpoint's layer c.layer + layer; layer 0 keeps the single-op kinds' streams.
Projection make_projection(const Config& c, const std::string& name, int64_t in, int64_t out,
                           int64_t layer = 0);

// An activation or output gradient: prod's and the baseline's copies (leaves that
// require grad when asked) and the reference's values [tokens, features].
struct Activation {
  at::Tensor prod, base;
  reference::Matrix ref;
};
Activation make_activation(const Config& c, const std::string& name, int64_t features,
                           bool requires_grad);

struct Dropout {
  LoraDropout device;
  reference::Dropout ref;
};
// Bernoulli(1 - p) mask from stream `name` over [tokens, features].
Dropout make_dropout(const Config& c, const std::string& name, int64_t features);

// Collects the ratio-rule checks of one case under <id>/layer0/<module>/.
class Checks {
 public:
  Checks(const Config& c, std::string prefix, bool keep_tensors)
      : config_(c), prefix_(std::move(prefix)), keep_tensors_(keep_tensors) {}
  // `projection`/`tensor`, e.g. ("q_proj", "lora_A.grad"); ref is reshaped to prod's
  // expected shape `shape` so a wrongly shaped prod fails.
  void add(const std::string& projection, const std::string& tensor, const at::Tensor& prod,
           const at::Tensor& base, const reference::Matrix& ref, at::IntArrayRef shape);
  void add_adapter_grads(const Projection& p, const at::Tensor& prod_dA, const at::Tensor& prod_dB,
                         const at::Tensor& base_dA, const at::Tensor& base_dB,
                         const reference::ProjectionGrads& ref);
  std::vector<report::Check> take() { return std::move(checks_); }

 private:
  const Config& config_;
  std::string prefix_;
  bool keep_tensors_;
  std::vector<report::Check> checks_;
};

// Wall time of one phase of a case and, for prod and base on CUDA, the peak memory
// the caching allocator handed out during it.
class Measure {
 public:
  explicit Measure(const Config& c, bool track_memory = true);
  // Appends <name>.seconds (since construction; on CUDA after a synchronize) and, when
  // tracking memory, <name>.peak_allocated_gib to `metrics`.
  void finish(const std::string& name, std::vector<std::pair<std::string, double>>& metrics);

 private:
  at::Device device_;
  bool track_memory_;
  std::chrono::steady_clock::time_point start_;
};

// For dumps: the generated inputs of a case (x, output gradients, initial adapters,
// dropout masks), recorded only when the run keeps tensors.
void keep_inputs(RunOutput& out, const RunOptions& options, const Activation& x,
                 const std::vector<std::pair<std::string, const Activation*>>& output_grads,
                 const std::vector<const Projection*>& projections,
                 const std::vector<std::pair<std::string, const Dropout*>>& dropouts);

enum class Impl { kProd, kBase };
// The autograd leaves of one implementation, in the order runners index gradients:
// x, then lora_A and lora_B of each projection in turn.
std::vector<at::Tensor> leaves(const Activation& x,
                               const std::vector<const Projection*>& projections, Impl impl);

// Gradients of `outputs` (seeded with `grad_outputs`) with respect to `inputs`.
std::vector<at::Tensor> gradients(const std::vector<at::Tensor>& outputs,
                                  const std::vector<at::Tensor>& inputs,
                                  const std::vector<at::Tensor>& grad_outputs);

}  // namespace gradscope::lora_testbed

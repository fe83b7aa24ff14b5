#include "harness/kinds/lora_testbed.h"

#include <ATen/ATen.h>
#include <sys/stat.h>
#include <torch/csrc/autograd/autograd.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <optional>
#include <sstream>

#include "gradscope/gptq_format.h"
#include "harness/checkpoint/checkpoint_reader.h"
#include "harness/common/dtypes.h"
#include "harness/common/input_error.h"
#include "harness/common/tensor_bridge.h"
#include "harness/generate/seeded_streams.h"
#include "harness/verdict/compare.h"

namespace gradscope::lora_testbed {

using report::SpecValue;

std::vector<FieldSpec> fields() {
  const auto s = [](const char* v) { return SpecValue(std::string(v)); };
  std::vector<FieldSpec> f = {
      FieldSpec("rank", FieldType::kInt, int64_t{8}, "LoRA rank r").in_range(1, 4096),
      FieldSpec("alpha", FieldType::kFloat, 16.0, "LoRA alpha; scaling = alpha / r")
          .in_range(-1e6, 1e6),
      FieldSpec("rslora", FieldType::kBool, false, "rsLoRA: scaling = alpha / sqrt(r)"),
      FieldSpec("dropout", FieldType::kFloat, 0.0, "dropout p on the adapter inputs, [0, 1)")
          .in_range(0, 1),
      FieldSpec("bias", FieldType::kBool, false, "frozen base bias on every projection"),
      FieldSpec("adapter_dtype", FieldType::kString, s("fp32"), "dtype of lora_A and lora_B")
          .one_of({s("fp32"), s("fp16"), s("bf16")}),
      FieldSpec("batch", FieldType::kInt, int64_t{2}, "batch; 0 = 2-D input [seq, features]")
          .in_range(0, 1 << 16),
      FieldSpec("seq", FieldType::kInt, int64_t{32}, "tokens per sequence").in_range(1, 1 << 20),
      FieldSpec("checkpoint", FieldType::kString, s(""),
                "GPTQ checkpoint folder whose packed weights replace the seeded layers"),
      FieldSpec("layer", FieldType::kInt, int64_t{0}, "decoder layer of the checkpoint")
          .in_range(0, 1 << 16),
      FieldSpec("tensors", FieldType::kString, s(""),
                "safetensors file whose tensors replace the seeded draws of the same name "
                "(x, dy, <projection>.lora_A, ...)"),
  };
  for (auto& p : profile_fields()) f.push_back(std::move(p));
  for (auto& g : gptq_fields()) f.push_back(std::move(g));
  return f;
}

int64_t case_tokens(const CaseSpec& spec) {
  const int64_t batch = spec.get_int("batch"), seq = spec.get_int("seq");
  return batch > 0 ? batch * seq : seq;
}

double reference_projection_bytes(const CaseSpec& spec, int64_t in, int64_t out) {
  const double tokens = static_cast<double>(case_tokens(spec));
  // W^T, and x, y, dy, dx in fp64.
  return 8.0 * (double(in) * double(out) + 2.0 * tokens * double(in + out));
}

void validate_heads(const CaseSpec& s, bool rope) {
  const int64_t hidden = s.get_int("hidden"), heads = s.get_int("heads"),
                kv = s.get_int("kv_heads");
  if (hidden % heads != 0 || (rope && (hidden / heads) % 2 != 0)) {
    throw_field_error(s, "heads",
                      "must divide hidden " + std::to_string(hidden) +
                          (rope ? " into heads of even width (RoPE pairs)" : "") + ", got " +
                          std::to_string(heads));
  }
  if (heads % kv != 0) {
    throw_field_error(s, "kv_heads",
                      "must divide heads " + std::to_string(heads) +
                          " (grouped-query attention), got " + std::to_string(kv));
  }
}

void validate(const CaseSpec& spec) {
  validate_gptq_fields(spec);
  if (spec.get_float("dropout") >= 1.0) {
    throw_field_error(spec, "dropout",
                      "must be below 1 (p = 1 drops every input), got " +
                          report::format_spec_value(spec.get_float("dropout")));
  }
  const std::string tensors = spec.get_string("tensors");
  struct stat st {};
  if (!tensors.empty() && (::stat(tensors.c_str(), &st) != 0 || !S_ISREG(st.st_mode))) {
    throw_field_error(spec, "tensors", "must name a file; there is none at '" + tensors + "'");
  }
  if (!tensors.empty() && spec.given_tensors) {
    throw_field_error(spec, "tensors",
                      "must be empty when the case's tensors are given as values (" +
                          spec.given_tensors->source + ")");
  }
}

Config::Config(const CaseSpec& s)
    : dtype(dtype_from_name(s.get_string("dtype"))),
      adapter_dtype(dtype_from_name(s.get_string("adapter_dtype"))),
      device(s.get_string("device") == "cuda" ? at::kCUDA : at::kCPU),
      seed(static_cast<uint64_t>(s.get_int("seed"))),
      rank(s.get_int("rank")),
      alpha(s.get_float("alpha")),
      rslora(s.get_bool("rslora")),
      dropout(s.get_float("dropout")),
      bias(s.get_bool("bias")),
      batch(s.get_int("batch")),
      seq(s.get_int("seq")),
      gptq(s),
      inputs(s),
      checkpoint(s.get_string("checkpoint")),
      layer(s.get_int("layer")),
      tensors_path(s.get_string("tensors")),
      given_tensors_(s.given_tensors) {}

bool has_tensors(const CaseSpec& spec) {
  return !spec.get_string("tensors").empty() || spec.given_tensors != nullptr;
}

const CaseTensors* Config::tensors() const {
  if (!tensors_ && given_tensors_) tensors_ = std::make_shared<CaseTensors>(given_tensors_);
  if (!tensors_ && !tensors_path.empty()) tensors_ = std::make_shared<CaseTensors>(tensors_path);
  return tensors_.get();
}

double Config::scaling() const {
  const double r = static_cast<double>(rank);
  return rslora ? alpha / std::sqrt(r) : alpha / r;
}

std::vector<int64_t> Config::shape(int64_t features) const {
  return batch > 0 ? std::vector<int64_t>{batch, seq, features}
                   : std::vector<int64_t>{seq, features};
}

std::string Config::id_suffix() const {
  std::ostringstream id;
  id << ".t" << (batch > 0 ? std::to_string(batch) + "x" : "") << seq << ".r" << rank << "."
     << gptq.id_part();
  if (dropout > 0) id << ".p" << dropout;
  if (bias) id << ".bias";
  if (alpha != 16.0) id << ".a" << alpha;
  if (rslora) id << ".rslora";
  if (adapter_dtype != at::kFloat)
    id << ".adapter-" << (adapter_dtype == at::kHalf ? "fp16" : "bf16");
  id << inputs.id_part();
  if (!checkpoint.empty()) id << ".ckpt-L" << layer;
  if (!tensors_path.empty() || given_tensors_) id << ".tensors";
  id << ".s" << seed;
  return id.str();
}

reference::Format format_of(at::ScalarType dtype) {
  const auto& d = floating_facts(dtype);
  return {d.unit_roundoff, d.subnormal_roundoff, d.max};
}

at::ScalarType adapter_compute_dtype(const Config& c) {
  return c.dtype == c.adapter_dtype ? c.dtype : at::promote_types(c.dtype, c.adapter_dtype);
}

reference::Precision precision(const Config& c) {
  // Sums accumulate in fp32, whose arithmetic may flush subnormal results to zero (CUDA's
  // fast paths do): below its smallest normal, 2^-126, a value may be off by that much.
  auto accumulate = format_of(at::kFloat);
  accumulate.subnormal = 0x1.0p-126;
  return {format_of(c.dtype), format_of(adapter_compute_dtype(c)), format_of(c.adapter_dtype),
          accumulate};
}

namespace {

// fp64 master -> the dtype an implementation holds -> its exact values for the reference.
at::Tensor rounded(const at::Tensor& master, at::ScalarType dtype) {
  return master.to(dtype);
}

at::Tensor leaf(const at::Tensor& values, const at::Device& device, bool requires_grad) {
  return values.to(device).clone().detach().requires_grad_(requires_grad);
}

}  // namespace

namespace {

const GptqCheckpoint& open_checkpoint(const std::string& dir) {
  // Cases of one run share a checkpoint: its files are mapped once.
  static std::map<std::string, std::unique_ptr<GptqCheckpoint>> open;
  auto& ckpt = open[dir];
  if (!ckpt) ckpt = std::make_unique<GptqCheckpoint>(dir);
  return *ckpt;
}

// The case's GPTQ fields describe the weights it reports on: a checkpoint that says otherwise
// would be run and its own format reported as the case's, so it is refused.
void refuse_contradictions(const Config& c, const QuantizeConfig& q) {
  const auto refuse = [&](const char* field, const std::string& file_value,
                          const std::string& case_value) {
    throw InputError(q.file + ": " + field + " is " + file_value + "; the case sets " + field +
                     " = " + case_value + " (case fields must match the checkpoint " +
                     c.checkpoint + ")");
  };
  const auto text = [](bool b) { return std::string(b ? "true" : "false"); };
  if (q.bits != c.gptq.bits) {
    refuse("bits", std::to_string(q.bits), std::to_string(c.gptq.bits));
  }
  if (q.group_size != c.gptq.group_size) {
    refuse("group_size", std::to_string(q.group_size), std::to_string(c.gptq.group_size));
  }
  if (q.desc_act != c.gptq.desc_act) refuse("desc_act", text(q.desc_act), text(c.gptq.desc_act));
  if (q.sym != c.gptq.sym) refuse("sym", text(q.sym), text(c.gptq.sym));
  if (q.static_groups != c.gptq.static_groups) {
    refuse("static_groups", text(q.static_groups), text(c.gptq.static_groups));
  }
  if (q.format != c.gptq.format) {
    refuse("format", std::string(to_string(q.format)), std::string(to_string(c.gptq.format)));
  }
}

// A projection's packed base from the `tensors` file: all four tensors or none, in the
// layout the case's bits and groups give, g_idx naming groups that exist.
std::optional<GptqWeight> packed_from_file(const Config& c, const std::string& stream, int64_t in,
                                           int64_t out) {
  const CaseTensors* file = c.tensors();
  if (!file) return std::nullopt;
  const char* parts[] = {"qweight", "qzeros", "scales", "g_idx"};
  int present = 0;
  for (const char* part : parts) present += file->has(stream + "." + part) ? 1 : 0;
  if (present == 0) return std::nullopt;
  if (present < 4 || !c.checkpoint.empty()) {
    throw InputError(file->path() + ": " + stream +
                     (present < 4 ? " has only some of qweight, qzeros, scales, g_idx: a packed "
                                    "base needs all four"
                                  : " has packed words, and the case also sets checkpoint"));
  }
  const int64_t bits = c.gptq.bits, groups = num_groups(in, c.gptq.group_size);
  GptqWeight w;
  w.qweight = *file->exact(stream + ".qweight", {in * bits / 32, out}, at::kInt);
  w.qzeros = *file->exact(stream + ".qzeros", {groups, out * bits / 32}, at::kInt);
  w.scales = *file->exact(stream + ".scales", {groups, out}, c.gptq.scales_dtype);
  w.g_idx = *file->exact(stream + ".g_idx", {in}, at::kInt);
  w.bits = c.gptq.bits;
  w.format = c.gptq.format;
  if (in > 0 && (w.g_idx.min().item<int32_t>() < 0 || w.g_idx.max().item<int32_t>() >= groups)) {
    throw InputError(file->path() + ": " + stream + ".g_idx names groups outside [0, " +
                     std::to_string(groups) + ")");
  }
  if (!w.scales.isfinite().all().item<bool>()) {
    throw InputError(file->path() + ": " + stream + ".scales holds a NaN or an infinity");
  }
  return w;
}

}  // namespace

void append_generated(std::vector<std::pair<std::string, at::Tensor>>& out,
                      const std::string& prefix, const Projection& p) {
  const LoraProjection& b = p.base;
  for (const auto& [part, t] :
       {std::pair{".qweight", b.base.qweight}, std::pair{".qzeros", b.base.qzeros},
        std::pair{".scales", b.base.scales}, std::pair{".g_idx", b.base.g_idx},
        std::pair{".lora_A", b.lora_A}, std::pair{".lora_B", b.lora_B},
        std::pair{".bias", b.bias}}) {
    if (t.defined()) out.emplace_back(prefix + part, t.detach().cpu().contiguous());
  }
}

void require_all_tensors_taken(const Config& c, const std::string& case_id) {
  if (c.tensors()) c.tensors()->require_all_taken(case_id);
}

Projection make_projection(const Config& c, const std::string& name, int64_t in, int64_t out,
                           int64_t layer) {
  Projection p;
  p.name = name;
  const std::string stream = (layer > 0 ? "layers." + std::to_string(layer) + "." : "") + name;
  GptqWeight packed;
  at::Tensor checkpoint_bias;
  if (auto given = packed_from_file(c, stream, in, out)) {
    packed = std::move(*given);
  } else if (c.checkpoint.empty()) {
    const auto q = quantize_seeded_layer(c.seed, stream + ".", in, out, c.gptq);
    packed = pack_gptq(q, c.gptq.bits, c.gptq.format, c.gptq.scales_dtype);
  } else {
    const std::string module = module_name(c.layer + std::max<int64_t>(layer - 1, 0), name);
    const auto& checkpoint = open_checkpoint(c.checkpoint);
    refuse_contradictions(c, checkpoint.config());
    auto loaded = checkpoint.load(module);
    if (loaded.weight.scales.scalar_type() != c.gptq.scales_dtype) {
      throw InputError(c.checkpoint + ": " + module + ".scales is " +
                       bridge::dtype_name(loaded.weight.scales.scalar_type()) +
                       "; the case sets scales_dtype = " + bridge::dtype_name(c.gptq.scales_dtype));
    }
    if (loaded.weight.in_features() != in || loaded.weight.out_features() != out) {
      throw InputError(c.checkpoint + ": " + module + " is [" +
                       std::to_string(loaded.weight.in_features()) + " -> " +
                       std::to_string(loaded.weight.out_features()) + "]; the case expects [" +
                       std::to_string(in) + " -> " + std::to_string(out) + "]");
    }
    if (c.bias && !loaded.bias.defined()) {
      throw InputError(c.checkpoint + ": " + module + " has no bias but the case sets bias = true");
    }
    packed = std::move(loaded.weight);
    checkpoint_bias = loaded.bias;
  }
  // lora_A ~ N(0, 1/in) like peft's kaiming init; lora_B is drawn non-zero (peft starts it
  // at zero, which would make dA identically zero and the check meaningless).
  const auto given = [&](const std::string& name, at::IntArrayRef shape, at::ScalarType dtype) {
    return c.tensors() ? c.tensors()->floating(stream + "." + name, shape, dtype) : std::nullopt;
  };
  const auto a = given("lora_A", {c.rank, in}, c.adapter_dtype)
                     .value_or(rounded(normal_tensor(c.seed, stream + ".lora_A", {c.rank, in},
                                                     1.0 / std::sqrt(in)),
                                       c.adapter_dtype));
  const auto b = given("lora_B", {out, c.rank}, c.adapter_dtype)
                     .value_or(rounded(normal_tensor(c.seed, stream + ".lora_B", {out, c.rank},
                                                     0.5 / std::sqrt(static_cast<double>(c.rank))),
                                       c.adapter_dtype));
  const auto given_bias = c.bias ? given("bias", {out}, c.dtype) : std::nullopt;
  const auto bias = !c.bias      ? at::Tensor()
                    : given_bias ? *given_bias
                    : checkpoint_bias.defined()
                        ? checkpoint_bias.to(at::kDouble).to(c.dtype)
                        : rounded(normal_tensor(c.seed, stream + ".bias", {out}, 0.1), c.dtype);

  p.ref.weight_t = reference::dequantize(bridge::to_reference(packed));
  if (bias.defined()) p.ref.bias = bridge::to_matrix(bias).row(0);
  p.ref.lora_A = bridge::to_matrix(a);
  p.ref.lora_B = bridge::to_matrix(b);
  p.ref.scaling = c.scaling();

  GptqWeight on_device = packed.to(c.device);
  // The baseline gets its own copy of the packed words: a prod that writes into its frozen
  // weights (a fault) must not move the baseline with it.
  GptqWeight base_copy = on_device;
  for (at::Tensor* t :
       {&base_copy.qweight, &base_copy.qzeros, &base_copy.scales, &base_copy.g_idx}) {
    *t = t->clone();
  }
  for (LoraProjection* impl : {&p.prod, &p.base}) {
    impl->base = impl == &p.prod ? on_device : base_copy;
    impl->bias = bias.defined() ? bias.to(c.device) : at::Tensor();
    impl->lora_A = leaf(a, c.device, true);
    impl->lora_B = leaf(b, c.device, true);
  }
  // Prod's scaling is what a user of the production library gets from it.
  p.prod.scaling = lora_scaling(c.alpha, c.rank, c.rslora);
  p.base.scaling = c.scaling();
  return p;
}

namespace {

Activation as_activation(const Config& c, const std::string& name, const at::Tensor& master,
                         int64_t features, bool requires_grad) {
  const auto values = rounded(master, c.dtype).reshape(c.shape(features));
  if (!values.isfinite().all().item<bool>()) {
    // A drawn input the dtype cannot hold (a loss scale or x_scale too large for it).
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.6g", master.abs().max().item<double>());
    throw InputError("input " + name + " reaches |" + name + "| = " + buf + ", beyond " +
                     bridge::dtype_name(c.dtype) + "'s largest finite value " +
                     report::format_number(format_of(c.dtype).max) +
                     ": the case's inputs are out of range for its dtype (lower x_scale or "
                     "loss_scale)");
  }
  return {leaf(values, c.device, requires_grad), leaf(values, c.device, requires_grad),
          bridge::to_matrix(values)};
}

}  // namespace

namespace {

// A given activation or output gradient replaces the profile's draw: fields that shape the draw
// would be reported in the id yet not apply, so they must stay at their defaults.
std::optional<at::Tensor> given_input(const Config& c, const std::string& name, int64_t features) {
  auto given = c.tensors() ? c.tensors()->floating(name, c.shape(features), c.dtype) : std::nullopt;
  if (given && !c.inputs.id_part().empty()) {
    throw InputError(c.tensors()->path() + ": tensor " + name +
                     " replaces the drawn one, so the case's input-profile fields (profile, "
                     "x_scale, loss_scale, x_zeros) must stay at their defaults");
  }
  return given;
}

}  // namespace

Activation make_activation(const Config& c, const std::string& name, int64_t features,
                           bool requires_grad) {
  if (auto given = given_input(c, name, features))
    return as_activation(c, name, given->to(at::kDouble), features, requires_grad);
  return as_activation(c, name, draw_activations(c.seed, name, c.inputs, c.tokens(), features),
                       features, requires_grad);
}

Activation make_output_grad(const Config& c, const std::string& name, int64_t features) {
  if (auto given = given_input(c, name, features))
    return as_activation(c, name, given->to(at::kDouble), features, false);
  return as_activation(c, name, draw_output_grads(c.seed, name, c.inputs, c.tokens(), features),
                       features, false);
}

Dropout make_dropout(const Config& c, const std::string& name, int64_t features) {
  Dropout d;
  d.device.p = c.dropout;
  d.ref.p = c.dropout;
  if (c.dropout == 0) return d;
  const auto keep = uniform_tensor(c.seed, name, {c.tokens(), features}).lt(1.0 - c.dropout);
  d.device.mask = keep.to(c.device);
  d.ref.mask = bridge::to_matrix(keep.to(at::kDouble));
  return d;
}

Checks::Checks(const Config& c, std::string prefix, bool keep_tensors,
               const reference::RoundingNoise& noise)
    : config_(c), prefix_(std::move(prefix)), keep_tensors_(keep_tensors) {
  const auto act = format_of(c.dtype);
  for (const auto& v : noise.stored()) {
    if (v.max_abs > act.max) {
      char buf[160];
      std::snprintf(buf, sizeof buf, "its %s reaches %.4g > %s max %.6g", v.name.c_str(), v.max_abs,
                    bridge::dtype_name(c.dtype).c_str(), act.max);
      model_format_ = bridge::dtype_name(c.dtype);
      model_overflow_ = buf;
      break;
    }
  }
}

void Checks::note_model_overflow(const std::string& what, const std::string& format) {
  if (!model_overflow_.empty()) return;
  model_overflow_ = what;
  model_format_ = format;
}

void Checks::add_as(const std::string& path, const Compared& t, at::IntArrayRef shape,
                    const Expected& expected, ErrorStatistic statistic) {
  RatioInputs in;
  in.path = prefix_ + path;
  in.prod = t.prod;
  in.base = t.base;
  in.ref = bridge::to_tensor(t.ref).reshape(shape);
  in.sigma = bridge::to_tensor(t.variance).sqrt().reshape(shape);
  in.expected = expected;
  in.format = bridge::dtype_name(expected.dtype);
  in.format_max = format_of(expected.dtype).max;
  in.model_overflow = model_overflow_;
  in.model_format = model_format_;
  in.not_judged = not_judged_;
  in.precision = bridge::dtype_name(config_.dtype) + " activations, " +
                 bridge::dtype_name(adapter_compute_dtype(config_)) + " adapter path";
  in.statistic = statistic;
  in.keep_tensors = keep_tensors_;
  checks_.push_back(compare_ratio(in));
}

void Checks::add(const std::string& projection, const std::string& tensor, const Compared& t,
                 at::IntArrayRef shape) {
  add_as(projection + "/" + tensor, t, shape, {config_.dtype, config_.device});
}

void Checks::add_adapter_grads(const Projection& p, const AdapterGrads& prod,
                               const AdapterGrads& base, const reference::ProjectionGrads& ref,
                               const reference::ProjectionGradsNoise& noise) {
  const Expected adapter{config_.adapter_dtype, config_.device};
  add_as(p.name + "/lora_A.grad", {prod.dA, base.dA, ref.dA, noise.dA}, p.prod.lora_A.sizes(),
         adapter);
  add_as(p.name + "/lora_B.grad", {prod.dB, base.dB, ref.dB, noise.dB}, p.prod.lora_B.sizes(),
         adapter);
}

void keep_inputs(CaseResult& out, bool keep_tensors, const Activation& x,
                 const std::vector<std::pair<std::string, const Activation*>>& output_grads,
                 const std::vector<const Projection*>& projections,
                 const std::vector<std::pair<std::string, const Dropout*>>& dropouts) {
  if (!keep_tensors) return;
  out.inputs.emplace_back("x", bridge::to_tensor_data(x.base));
  for (const auto& [name, g] : output_grads) {
    out.inputs.emplace_back(name, bridge::to_tensor_data(g->base));
  }
  for (const auto* p : projections) {
    out.inputs.emplace_back(p->name + ".lora_A", bridge::to_tensor_data(p->base.lora_A));
    out.inputs.emplace_back(p->name + ".lora_B", bridge::to_tensor_data(p->base.lora_B));
  }
  for (const auto& [name, d] : dropouts) {
    if (d->device.p > 0) out.inputs.emplace_back(name, bridge::to_tensor_data(d->device.mask));
  }
}

std::vector<NamedProjection> copies_of(const std::vector<const Projection*>& projections,
                                       Role role) {
  std::vector<NamedProjection> out;
  for (const auto* p : projections) out.push_back({p->name, &p->of(role)});
  return out;
}

const AdapterGrads& Gradients::of(const std::string& projection) const {
  const auto it = adapters.find(projection);
  if (it == adapters.end()) throw std::logic_error("no adapter gradients of " + projection);
  return it->second;
}

Gradients backward(const std::vector<at::Tensor>& outputs,
                   const std::vector<at::Tensor>& grad_outputs, const at::Tensor& x,
                   const std::vector<NamedProjection>& projections) {
  // x undefined (or not requiring grad): the adapters' gradients only.
  const bool with_x = x.defined() && x.requires_grad();
  std::vector<at::Tensor> inputs;
  if (with_x) inputs.push_back(x);
  for (const auto& p : projections) {
    inputs.push_back(p.projection->lora_A);
    inputs.push_back(p.projection->lora_B);
  }
  // allow_unused: an input the graph never reached comes back undefined, and the
  // comparison then fails it as a zero gradient instead of throwing here.
  auto grads = torch::autograd::grad(outputs, inputs, grad_outputs, /*retain_graph=*/false,
                                     /*create_graph=*/false, /*allow_unused=*/true);
  for (size_t i = 0; i < grads.size(); ++i) {
    if (!grads[i].defined()) grads[i] = at::zeros_like(inputs[i]);
  }
  Gradients g;
  auto next = grads.begin();
  if (with_x) g.dx = *next++;
  for (const auto& p : projections) {
    auto& a = g.adapters[p.name];
    a.dA = *next++;
    a.dB = *next++;
  }
  return g;
}

}  // namespace gradscope::lora_testbed

// kind = "layer": a stack of decoder layers of a declared model family (RMSNorm, LoRA_QKV,
// RoPE, causal GQA attention, LoRA_W, LoRA_MLP, residuals, and the parts the family configures:
// docs/model-families.md), checked layer by layer: each layer's output, the gradient of its
// input hidden state and every adapter gradient.
#include <ATen/ATen.h>

#include <optional>

#include "gradscope/decoder_layer.h"
#include "harness/baseline/aten_baseline.h"
#include "harness/common/tensor_bridge.h"
#include "harness/kinds/decoder_stack.h"
#include "harness/kinds/field_draws.h"
#include "harness/kinds/kind_decls.h"
#include "reference/layer_reference.h"

namespace gradscope {
namespace {

namespace tb = lora_testbed;
namespace ds = decoder_stack;

// prod_calls: which operators of the implementation under test a case calls.
constexpr const char* kLoraOps = "lora_ops";            // its LoRA ops inside gradscope's layer
constexpr const char* kDecoderLayer = "decoder_layer";  // its whole decoder layer

class LayerTestbed final : public Testbed {
 public:
  explicit LayerTestbed(const CaseContext& context)
      : context_(context),
        c_(context.spec),
        dims_(context.spec),
        shape_(dims_.attention(c_)),
        whole_layer_(context.spec.get_string("prod_calls") == kDecoderLayer) {}

  // Each layer's inputs and output gradients, which prod and base take from the reference, are
  // computed in generate (docs/case-files.md, kind layer): ref and floor may run beside the
  // baseline.
  PhasePlan plan() const override { return {true, false, false}; }

  // The stack and, through the reference, each layer's input and output gradient: every layer
  // of prod and base starts from the reference's input of that layer and output gradient,
  // rounded to the case dtype, like the single-op kinds. Noise accumulated through a stack is
  // different but equally valid in prod and base, so comparing it would judge the stack's
  // conditioning rather than the kernels.
  void generate() override {
    stack_ = ds::make_stack(c_, dims_);
    x_ = tb::make_activation(c_, "x", dims_.hidden, true);
    dy_ = tb::make_output_grad(c_, "dy", dims_.hidden);
    tb::require_all_tensors_taken(c_, context_.id);
    const int64_t n = dims_.layers;
    std::vector<reference::Matrix> ref_inputs, ref_dys(n);
    reference::Matrix h = x_.ref;
    for (const auto& L : stack_) {
      ref_inputs.push_back(h);
      tapes_.push_back(reference::layer_tape(h, L.ref, shape_));
      h = tapes_.back().out;
    }
    reference::Matrix dh = dy_.ref;
    for (int64_t i = n - 1; i >= 0; --i) {
      ref_dys[i] = dh;
      // Layer 0's input gradient feeds no other layer: ref() computes it on its own.
      if (i > 0) {
        dh = reference::layer_backward(tapes_[i], ref_inputs[i], dh, stack_[i].ref, shape_).dx;
      }
    }
    tapes_.resize(1);  // layer 0's input is the generated x itself: its tape stands
    const auto as_matrix = [&](const reference::Matrix& m) {
      return bridge::to_matrix(rounded(m).to(at::kDouble).reshape({-1, dims_.hidden}));
    };
    for (int64_t i = 0; i < n; ++i) {
      inputs_.push_back(i == 0 ? x_.ref : as_matrix(ref_inputs[i]));
      dys_.push_back(i + 1 == n ? dy_.ref : as_matrix(ref_dys[i]));
    }
  }

  std::vector<std::pair<std::string, at::Tensor>> generated() const override {
    std::vector<std::pair<std::string, at::Tensor>> out{{"x", x_.base.detach().cpu()},
                                                        {"dy", dy_.base.cpu()}};
    for (size_t i = 0; i < stack_.size(); ++i) {
      const std::string layer = "layers." + std::to_string(i + 1) + ".";
      out.emplace_back(layer + "input_norm", stack_[i].input_norm);
      out.emplace_back(layer + "post_attention_norm", stack_[i].post_attention_norm);
      for (const auto& p : stack_[i].projections) tb::append_generated(out, layer + p.name, p);
    }
    return out;
  }

  // Layer i's reference on exactly the rounded input and gradient prod sees, and the floor on
  // that problem (timed apart, as floor.seconds, inside this phase).
  void ref() override {
    noise_.emplace(tb::precision(c_));
    for (int64_t i = 0; i < dims_.layers; ++i) {
      const auto tape =
          i == 0 ? std::move(tapes_[0]) : reference::layer_tape(inputs_[i], stack_[i].ref, shape_);
      ref_out_.push_back(tape.out);
      ref_grads_.push_back(
          reference::layer_backward(tape, inputs_[i], dys_[i], stack_[i].ref, shape_));
      PhaseTimer floor(false, false);
      floor_.push_back(noise_->layer(tape, inputs_[i], dys_[i], stack_[i].ref, shape_,
                                     ref_grads_[i], "layer" + std::to_string(i)));
      floor_seconds_ += floor.seconds();
    }
  }

  void prod() override { run(tb::Role::kProd, prod_); }
  void base() override { run(tb::Role::kBase, base_); }

  void verify(CaseResult& out) override {
    out.metrics.emplace_back("floor.seconds", floor_seconds_);
    out.metrics.emplace_back("prod.setup_seconds", prod_setup_seconds_);
    out.metrics.emplace_back("base.setup_seconds", base_setup_seconds_);
    out.metrics.emplace_back("inputs.first_position", double(shape_.position_offset));
    const bool keep = context_.options.keep_tensors;
    for (int64_t i = 0; i < dims_.layers; ++i) {
      const std::string layer = context_.id + "/layer" + std::to_string(i) + "/";
      const auto &g = prod_[i], &gb = base_[i];
      const auto& n = floor_[i];
      out.metrics.emplace_back("layer" + std::to_string(i) + ".score_sigma", n.scores.sigma);
      const auto not_judged =
          ds::attention_beyond_model(n.scores, "layer " + std::to_string(i), c_);
      tb::Checks block(c_, layer, keep, *noise_);
      block.note_not_judged(not_judged);
      block.add("hidden", "output", {g.out, gb.out, ref_out_[i], n.out}, c_.shape(dims_.hidden));
      block.add("hidden", "input.grad", {g.grads.dx, gb.grads.dx, ref_grads_[i].dx, n.dx},
                c_.shape(dims_.hidden));
      append(out, block);
      for (const char* module : {"self_attn", "mlp"}) {
        tb::Checks checks(c_, layer + module + "/", keep, *noise_);
        checks.note_not_judged(not_judged);
        for (const auto& p : stack_[i].projections) {
          if (module_of(p.name) != module) continue;
          checks.add_adapter_grads(p, g.grads.of(p.name), gb.grads.of(p.name),
                                   member(ref_grads_[i], p.name), member(n, p.name));
        }
        append(out, checks);
      }
    }
    // Adapters are not dumped: every layer repeats the projection names.
    tb::keep_inputs(out, keep, x_, {{"dy", &dy_}}, {}, {});
  }

 private:
  struct Pass {
    at::Tensor out;
    tb::Gradients grads;
  };

  at::Tensor rounded(const reference::Matrix& m) const {
    return bridge::to_tensor(m).to(c_.dtype).reshape(c_.shape(dims_.hidden));
  }

  // Building a layer's device modules from the host tensors is part of each pass; it is also
  // timed on its own (prod.setup_seconds, base.setup_seconds).
  void run(tb::Role role, std::vector<Pass>& passes) {
    const bool is_prod = role == tb::Role::kProd;
    const impl::Ops impl(context_.options.impl);
    const auto ops = is_prod ? impl::layer_ops(impl, c_.lora_args()) : LayerLoraOps{};
    const int64_t n = dims_.layers;
    for (int64_t i = 0; i < n; ++i) {
      const auto h = i == 0 ? x_.of(role) : rounded(inputs_[i]).to(c_.device).requires_grad_(true);
      const auto dy = i + 1 == n ? dy_.of(role) : rounded(dys_[i]).to(c_.device);
      PhaseTimer setup(c_.device.is_cuda(), false);
      const auto d = ds::device_layer(c_, dims_, stack_[i], role, shape_.position_offset);
      (is_prod ? prod_setup_seconds_ : base_setup_seconds_) += setup.seconds();
      const auto y = !is_prod       ? baseline::decoder_layer(h, d)
                     : whole_layer_ ? impl.decoder_layer(h, d, c_.lora_args())
                                    : decoder_layer(h, d, ops);
      passes.push_back({y.detach(), tb::backward({y}, {dy}, h, ds::named_projections(d))});
    }
  }

  static void append(CaseResult& out, tb::Checks& checks) {
    for (auto& check : checks.take()) out.checks.push_back(std::move(check));
  }

  const CaseContext context_;
  const tb::Config c_;
  const ds::Dims dims_;
  const reference::AttentionShape shape_;
  const bool whole_layer_;
  std::vector<ds::StackLayer> stack_;
  tb::Activation x_, dy_;
  std::vector<reference::LayerTape> tapes_;
  std::vector<reference::Matrix> inputs_, dys_;  // each layer's, as prod and base see them
  std::vector<reference::Matrix> ref_out_;
  std::vector<reference::LayerGrads> ref_grads_;
  std::optional<reference::RoundingNoise> noise_;
  std::vector<reference::LayerNoise> floor_;
  double floor_seconds_ = 0, prod_setup_seconds_ = 0, base_setup_seconds_ = 0;
  std::vector<Pass> prod_, base_;
};

}  // namespace

KindDecl layer_kind() {
  KindDecl k;
  k.name = "layer";
  k.fields = ds::fields();
  using report::SpecValue;
  k.fields.push_back(
      FieldSpec("prod_calls", FieldType::kString, SpecValue(std::string(kLoraOps)),
                "what prod runs: its LoRA ops inside gradscope's decoder layer (lora_ops) or "
                "its own whole decoder layer (decoder_layer)")
          .one_of({SpecValue(std::string(kLoraOps)), SpecValue(std::string(kDecoderLayer))}));
  for (auto& f : lora_testbed::fields()) k.fields.push_back(std::move(f));
  k.case_id = [](const CaseSpec& s) {
    const bool whole = s.get_string("prod_calls") == kDecoderLayer;
    return "layer." + s.get_string("dtype") + "." + ds::Dims(s).id_part() +
           (whole ? ".whole" : "") + tb::Config(s).id_suffix();
  };
  k.validate = [](const CaseSpec& s) { ds::validate(s, "layer"); };
  k.prod_ops = {"lora_qkv", "lora_w", "lora_mlp"};
  k.prod_ops_of_case = [ops = k.prod_ops](const CaseSpec& s) {
    return s.get_string("prod_calls") == kDecoderLayer ? std::vector<std::string>{kDecoderLayer}
                                                       : ops;
  };
  k.inputs = [](const CaseSpec&) { return std::vector<std::string>{"x", "dy"}; };
  k.gradients = [](const CaseSpec&) { return std::vector<CaseGradient>{{"dy", "output"}}; };
  k.parts = ds::parts;
  k.host_bytes_at_least = ds::stack_reference_bytes;
  k.testbed = [](const CaseContext& c) { return std::make_unique<LayerTestbed>(c); };
  k.sample = [](CaseDraw& d) {
    field_draws::decoder_shape(d, field_draws::gptq(d));
    d.set("layers", d.pick<int64_t>({1, 1, 2}));
    field_draws::lora(d, false, false, 96);
    field_draws::positions(d);
    field_draws::x_zeros(d);
    field_draws::norm_and_rope(d);
  };
  return k;
}

}  // namespace gradscope

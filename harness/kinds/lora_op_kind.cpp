#include "harness/kinds/lora_op_kind.h"

#include <ATen/ATen.h>

#include <memory>
#include <optional>
#include <stdexcept>

#include "harness/baseline/aten_baseline.h"
#include "harness/kinds/field_draws.h"

namespace gradscope::lora_testbed {
namespace {

template <class T>
const T& find(const Named<T>& tensors, const std::string& name, const char* what) {
  const auto it = tensors.find(name);
  if (it == tensors.end()) throw std::logic_error(std::string("no ") + what + " named " + name);
  return it->second;
}

class LoraOpTestbed final : public Testbed {
 public:
  LoraOpTestbed(const LoraOpDecl& decl, const CaseContext& context)
      : decl_(decl), context_(context), c_(context.spec), shape_(decl.shape(context.spec)) {}

  void generate() override {
    for (const auto& p : shape_.projections) {
      projections_.push_back(make_projection(c_, p.name, p.in, p.out));
    }
    x_ = make_activation(c_, "x", shape_.in_features, true);
    for (const auto& o : shape_.outputs) {
      output_grads_.push_back(make_output_grad(c_, o.grad, o.features));
    }
    for (const auto& d : shape_.dropouts) dropouts_.push_back(make_dropout(c_, d.name, d.features));
    require_all_tensors_taken(c_, context_.id);
    // Indexed once every vector is final.
    for (const auto& p : projections_) projection_of_[p.name] = &p;
    for (size_t i = 0; i < output_grads_.size(); ++i) {
      output_grad_of_[shape_.outputs[i].grad] = &output_grads_[i];
    }
    for (size_t i = 0; i < dropouts_.size(); ++i) {
      dropout_of_[shape_.dropouts[i].name] = &dropouts_[i];
    }
  }

  // The dropout masks are drawn from the seed only: a tensors file does not replace them.
  std::vector<std::pair<std::string, at::Tensor>> generated() const override {
    std::vector<std::pair<std::string, at::Tensor>> out{{"x", x_.base.detach().cpu()}};
    for (size_t i = 0; i < output_grads_.size(); ++i) {
      out.emplace_back(shape_.outputs[i].grad, output_grads_[i].base.cpu());
    }
    for (const auto& p : projections_) append_generated(out, p.name, p);
    return out;
  }

  void prod() override { run(Role::kProd, prod_); }
  void base() override { run(Role::kBase, base_); }

  void ref() override {
    ref_ = decl_.ref ? decl_.ref(ref_args()) : mlp() ? mlp_ref() : linear_ref();
  }

  void floor() override {
    noise_.emplace(precision(c_));
    floor_ = decl_.floor ? decl_.floor(*noise_, ref_args(), ref_)
             : mlp()     ? mlp_floor()
                         : linear_floor();
  }

  void verify(CaseResult& out) override {
    const bool keep = context_.options.keep_tensors;
    Checks checks(c_, context_.id + "/layer0/" + decl_.module + "/", keep, *noise_);
    for (const auto& o : shape_.outputs) {
      checks.add(
          o.name, "output",
          {find(prod_.outputs, o.name, "prod output"), find(base_.outputs, o.name, "base output"),
           *find(ref_.outputs, o.name, "reference output"),
           *find(floor_.outputs, o.name, "floor of output")},
          c_.shape(o.features));
    }
    checks.add(shape_.input_grad, "input.grad",
               {prod_.grads.dx, base_.grads.dx, *ref_.dx, *floor_.dx},
               c_.shape(shape_.in_features));
    for (const auto& p : projections_) {
      checks.add_adapter_grads(p, prod_.grads.of(p.name), base_.grads.of(p.name),
                               *find(ref_.grads, p.name, "reference gradients"),
                               *find(floor_.grads, p.name, "floor of gradients"));
    }
    std::vector<std::pair<std::string, const Activation*>> output_grads;
    for (const auto& o : shape_.outputs) output_grads.emplace_back(o.grad, output_grad_of_[o.grad]);
    std::vector<std::pair<std::string, const Dropout*>> dropouts;
    for (const auto& d : shape_.dropouts) dropouts.emplace_back(d.name, dropout_of_[d.name]);
    keep_inputs(out, keep, x_, output_grads, all_projections(), dropouts);
    out.checks = checks.take();
  }

 private:
  struct Pass {
    Named<at::Tensor> outputs;
    Gradients grads;
  };

  std::vector<const Projection*> all_projections() const {
    std::vector<const Projection*> all;
    for (const auto& p : projections_) all.push_back(&p);
    return all;
  }

  void run(Role role, Pass& pass) {
    const OpArgs args{x_.of(role), projection_of_, dropout_of_, role, c_.lora_args()};
    if (role == Role::kProd) {
      pass.outputs = decl_.prod(impl::Ops(context_.options.impl), args);
    } else if (decl_.base) {
      pass.outputs = decl_.base(args);
    } else if (mlp()) {
      pass.outputs["down_proj"] = baseline::lora_mlp(
          args.x, args.projection("gate_proj"), args.projection("up_proj"),
          args.projection("down_proj"), args.dropout("dropout.x"), args.dropout("dropout.h"));
    } else {
      for (const auto& o : shape_.outputs) {
        pass.outputs[o.name] = baseline::lora_linear(args.x, args.projection(o.name),
                                                     args.dropout(shape_.dropouts.at(0).name));
      }
    }
    std::vector<at::Tensor> outputs, grads;
    for (const auto& o : shape_.outputs) {
      outputs.push_back(find(pass.outputs, o.name, "output"));
      grads.push_back(output_grad_of_.at(o.grad)->of(role));
    }
    pass.grads = backward(outputs, grads, x_.of(role), copies_of(all_projections(), role));
  }

  RefArgs ref_args() const { return {x_.ref, projection_of_, output_grad_of_, dropout_of_}; }

  // The default reference and floor: each output is the LoRA linear of x through the
  // projection of its name, with the first dropout mask, and x's gradient is the sum of their
  // input gradients in output order (LoRA_QKV: q, then k, then v).
  struct Linear {
    std::string name;
    const reference::Projection& p;
    const reference::Matrix& dy;
  };
  std::vector<Linear> linears() const {
    if (shape_.projections.size() != shape_.outputs.size()) {
      throw std::logic_error(decl_.kind +
                             ": an output named after each projection, or its own ref and floor");
    }
    const RefArgs a = ref_args();
    std::vector<Linear> out;
    for (const auto& o : shape_.outputs) {
      out.push_back({o.name, a.projection(o.name), a.output_grad(o.grad)});
    }
    return out;
  }
  const reference::Dropout& first_dropout() const {
    return ref_args().dropout(shape_.dropouts.at(0).name);
  }
  struct LinearsRef {
    std::vector<reference::Matrix> y;
    std::vector<reference::ProjectionGrads> g;
    reference::Matrix dx;  // with more than one output
  };
  RefResult linear_ref() const {
    const auto linear = linears();
    LinearsRef v;
    for (const auto& l : linear)
      v.y.push_back(reference::lora_forward(x_.ref, l.p, first_dropout()));
    for (const auto& l : linear) {
      v.g.push_back(reference::lora_backward(x_.ref, l.dy, l.p, first_dropout()));
    }
    if (v.g.size() > 1) {
      v.dx = v.g[0].dx + v.g[1].dx;
      for (size_t i = 2; i < v.g.size(); ++i) v.dx += v.g[i].dx;
    }
    RefResult r;
    auto& owned = r.own(std::move(v));
    for (size_t i = 0; i < linear.size(); ++i) {
      r.outputs[linear[i].name] = &owned.y[i];
      r.grads[linear[i].name] = &owned.g[i];
    }
    r.dx = linear.size() == 1 ? &owned.g[0].dx : &owned.dx;
    return r;
  }
  struct LinearsFloor {
    std::vector<reference::ProjectionForwardNoise> y;
    std::vector<reference::ProjectionGradsNoise> g;
    reference::Matrix dx;  // with more than one output
  };
  FloorResult linear_floor() {
    const auto linear = linears();
    const auto& ref = ref_.as<LinearsRef>();
    const reference::Matrix exact;  // x and the output gradients are inputs, not intermediates
    LinearsFloor v;
    for (size_t i = 0; i < linear.size(); ++i) {
      const auto& l = linear[i];
      v.y.push_back(noise_->lora_forward(x_.ref, exact, l.p, first_dropout(), ref.y[i], l.name));
    }
    for (size_t i = 0; i < linear.size(); ++i) {
      const auto& l = linear[i];
      v.g.push_back(noise_->lora_backward(x_.ref, exact, l.dy, exact, l.p, first_dropout(), v.y[i],
                                          ref.g[i], l.name));
    }
    if (linear.size() > 1) {
      // The shares' variances, then each partial sum's rounding (the last is x's gradient).
      v.dx = v.g[0].dx;
      for (size_t i = 1; i < v.g.size(); ++i) v.dx += v.g[i].dx;
      const auto& act = precision(c_).activation;
      reference::Matrix partial = ref.g[0].dx;
      for (size_t i = 1; i < v.g.size(); ++i) {
        partial += ref.g[i].dx;
        v.dx += reference::rounding_variance(partial, act);
        // A partial sum is held in the activation format: it may overflow where x's gradient
        // does not.
        if (i + 1 < v.g.size()) noise_->store("input.grad.partial_sum", partial);
      }
    }
    FloorResult f;
    auto& owned = f.own(std::move(v));
    for (size_t i = 0; i < linear.size(); ++i) {
      f.outputs[linear[i].name] = &owned.y[i].y;
      f.grads[linear[i].name] = &owned.g[i];
    }
    f.dx = linear.size() == 1 ? &owned.g[0].dx : &owned.dx;
    return f;
  }

  bool mlp() const { return decl_.body == LoraOpDecl::Body::kSwigluMlp; }
  // The SwiGLU MLP's reference (its tape kept for the floor) and floor.
  struct MlpRef {
    reference::MlpTape tape;
    reference::Matrix y;
    reference::MlpGrads g;
  };
  RefResult mlp_ref() const {
    const RefArgs a = ref_args();
    const auto &gate = a.projection("gate_proj"), &up = a.projection("up_proj"),
               &down = a.projection("down_proj");
    const auto &dx = a.dropout("dropout.x"), &dh = a.dropout("dropout.h");
    RefResult r;
    auto& v = r.own(MlpRef{reference::mlp_tape(a.x, gate, up, dx), {}, {}});
    v.y = reference::lora_forward(reference::swiglu(v.tape.e, v.tape.g), down, dh);
    v.g = reference::mlp_backward(v.tape, a.x, a.output_grad("dy"), gate, up, down, dx, dh);
    r.outputs = {{"down_proj", &v.y}};
    r.dx = &v.g.dx;
    r.grads = {{"gate_proj", &v.g.gate}, {"up_proj", &v.g.up}, {"down_proj", &v.g.down}};
    return r;
  }
  FloorResult mlp_floor() {
    const RefArgs a = ref_args();
    const auto& ref = ref_.as<MlpRef>();
    FloorResult f;
    auto& n = f.own(noise_->mlp(ref.tape, a.x, a.output_grad("dy"), a.projection("gate_proj"),
                                a.projection("up_proj"), a.projection("down_proj"),
                                a.dropout("dropout.x"), a.dropout("dropout.h"), ref.y, ref.g));
    f.outputs = {{"down_proj", &n.y}};
    f.dx = &n.dx;
    f.grads = {{"gate_proj", &n.gate}, {"up_proj", &n.up}, {"down_proj", &n.down}};
    return f;
  }

  const LoraOpDecl& decl_;
  const CaseContext context_;
  const Config c_;
  const LoraOpShape shape_;
  std::vector<Projection> projections_;
  Activation x_;
  std::vector<Activation> output_grads_;
  std::vector<Dropout> dropouts_;
  Named<const Projection*> projection_of_;
  Named<const Activation*> output_grad_of_;
  Named<const Dropout*> dropout_of_;
  Pass prod_, base_;
  RefResult ref_;
  std::optional<reference::RoundingNoise> noise_;
  FloorResult floor_;
};

}  // namespace

const LoraProjection& OpArgs::projection(const std::string& name) const {
  return find(projections, name, "projection")->of(role);
}

const LoraDropout& OpArgs::dropout(const std::string& name) const {
  return find(dropouts, name, "dropout")->device;
}

const reference::Projection& RefArgs::projection(const std::string& name) const {
  return find(projections, name, "projection")->ref;
}

const reference::Matrix& RefArgs::output_grad(const std::string& name) const {
  return find(output_grads, name, "output gradient")->ref;
}

const reference::Dropout& RefArgs::dropout(const std::string& name) const {
  return find(dropouts, name, "dropout")->ref;
}

KindDecl lora_op_kind(LoraOpDecl op) {
  // The default floor reads the default reference's results: one without the other is a
  // declaration error, caught when the kind is registered rather than in a case.
  if (static_cast<bool>(op.ref) != static_cast<bool>(op.floor)) {
    throw std::logic_error(op.kind +
                           ": declare both ref and floor, or neither (a LoRA linear per output)");
  }
  KindDecl k;
  k.name = op.kind;
  k.fields = op.fields;
  for (auto& f : fields()) k.fields.push_back(std::move(f));
  k.prod_ops = op.prod_ops;
  const auto decl = std::make_shared<const LoraOpDecl>(std::move(op));
  k.case_id = [decl](const CaseSpec& s) {
    return decl->kind + "." + s.get_string("dtype") + "." + decl->id_part(s) +
           Config(s).id_suffix();
  };
  k.validate = [decl](const CaseSpec& s) {
    validate(s);
    if (decl->validate) decl->validate(s);
    for (const auto& p : decl->shape(s).projections) {
      validate_gptq_shape(s, p.in, p.out, p.in_field, p.out_field);
    }
  };
  k.inputs = [decl](const CaseSpec& s) {
    std::vector<std::string> names{"x"};
    for (const auto& o : decl->shape(s).outputs) names.push_back(o.grad);
    return names;
  };
  k.gradients = [decl](const CaseSpec& s) {
    std::vector<CaseGradient> out;
    for (const auto& o : decl->shape(s).outputs) out.push_back({o.grad, o.name});
    return out;
  };
  k.parts = [decl](const CaseSpec& s) {
    std::vector<CasePart> out;
    for (const auto& p : decl->shape(s).projections) out.push_back({p.name, p.name});
    return out;
  };
  k.host_bytes_at_least = [decl](const CaseSpec& s) {
    double bytes = 0;
    for (const auto& p : decl->shape(s).projections) {
      bytes += reference_projection_bytes(s, p.in, p.out);
    }
    return bytes;
  };
  k.testbed = [decl](const CaseContext& context) -> std::unique_ptr<Testbed> {
    return std::make_unique<LoraOpTestbed>(*decl, context);
  };
  k.sample = [decl](CaseDraw& d) {
    decl->sample(d);
    field_draws::x_zeros(d);
  };
  return k;
}

}  // namespace gradscope::lora_testbed

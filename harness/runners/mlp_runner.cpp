// kind = "mlp": a SwiGLU MLP (gate_proj, up_proj, down_proj) through LoRA_MLP.
#include <ATen/ATen.h>

#include "harness/baseline/aten_baseline.h"
#include "harness/impl/impl_ops.h"
#include "harness/runners/lora_testbed.h"
#include "harness/runners/runner_factories.h"

namespace gradscope {
namespace {

namespace tb = lora_testbed;

class MlpRunner final : public CaseRunner {
 public:
  std::string kind() const override { return "mlp"; }

  std::vector<FieldSpec> fields() const override {
    std::vector<FieldSpec> f = {
        FieldSpec("hidden", FieldType::kInt, int64_t{256}, "hidden size").in_range(1, 1 << 20),
        FieldSpec("intermediate", FieldType::kInt, int64_t{688}, "intermediate size")
            .in_range(1, 1 << 20),
    };
    for (auto& x : tb::fields()) f.push_back(std::move(x));
    return f;
  }

  std::string case_id(const CaseSpec& s) const override {
    return "mlp." + s.get_string("dtype") + ".h" + std::to_string(s.get_int("hidden")) + "i" +
           std::to_string(s.get_int("intermediate")) + tb::Config(s).id_suffix();
  }

  std::vector<std::string> prod_ops() const override { return {"lora_mlp"}; }

  double host_bytes_at_least(const CaseSpec& s) const override {
    const int64_t hidden = s.get_int("hidden"), inter = s.get_int("intermediate");
    return 2 * tb::reference_projection_bytes(s, hidden, inter) +
           tb::reference_projection_bytes(s, inter, hidden);
  }

  void validate(const CaseSpec& s) const override {
    tb::validate(s);
    validate_gptq_shape(s, s.get_int("hidden"), s.get_int("intermediate"), "hidden",
                        "intermediate");
    validate_gptq_shape(s, s.get_int("intermediate"), s.get_int("hidden"), "intermediate",
                        "hidden");
  }

  RunOutput run(const CaseSpec& s, const std::string& id,
                const RunOptions& options) const override {
    const tb::Config c(s);
    const int64_t hidden = s.get_int("hidden"), inter = s.get_int("intermediate");
    RunOutput result;
    tb::Measure generate_time(c, /*track_memory=*/false);
    auto gate = tb::make_projection(c, "gate_proj", hidden, inter);
    auto up = tb::make_projection(c, "up_proj", hidden, inter);
    auto down = tb::make_projection(c, "down_proj", inter, hidden);
    auto x = tb::make_activation(c, "x", hidden, true);
    auto dy = tb::make_output_grad(c, "dy", hidden);
    auto drop_x = tb::make_dropout(c, "dropout.x", hidden);
    auto drop_h = tb::make_dropout(c, "dropout.h", inter);
    generate_time.finish("generate", result.metrics);
    tb::Measure prod_time(c);
    const auto y = impl::Ops(options.impl)
                       .lora_mlp(x.prod, gate.prod, up.prod, down.prod, c.lora_args(),
                                 drop_x.device, drop_h.device);
    const auto g =
        tb::backward({y}, {dy.prod}, x.prod, tb::of({&gate, &up, &down}, tb::Impl::kProd));
    prod_time.finish("prod", result.metrics);

    tb::Measure base_time(c);
    const auto yb =
        baseline::lora_mlp(x.base, gate.base, up.base, down.base, drop_x.device, drop_h.device);
    const auto gb =
        tb::backward({yb}, {dy.base}, x.base, tb::of({&gate, &up, &down}, tb::Impl::kBase));
    base_time.finish("base", result.metrics);

    tb::Measure ref_time(c, /*track_memory=*/false);
    const auto tape = reference::mlp_tape(x.ref, gate.ref, up.ref, drop_x.ref);
    const auto yr =
        reference::lora_forward(reference::swiglu(tape.e, tape.g), down.ref, drop_h.ref);
    const auto gr = reference::mlp_backward(tape, x.ref, dy.ref, gate.ref, up.ref, down.ref,
                                            drop_x.ref, drop_h.ref);
    ref_time.finish("ref", result.metrics);

    tb::Measure floor_time(c, /*track_memory=*/false);
    reference::RoundingNoise noise(tb::precision(c));
    const auto n =
        noise.mlp(tape, x.ref, dy.ref, gate.ref, up.ref, down.ref, drop_x.ref, drop_h.ref, yr, gr);
    floor_time.finish("floor", result.metrics);

    tb::Checks checks(c, id + "/layer0/mlp/", options.keep_tensors, noise);
    checks.add("down_proj", "output", {y, yb, yr, n.y}, c.shape(hidden));
    checks.add("gate_up_proj", "input.grad", {g.dx, gb.dx, gr.dx, n.dx}, c.shape(hidden));
    checks.add_adapter_grads(gate, g.adapters[0], gb.adapters[0], gr.gate, n.gate);
    checks.add_adapter_grads(up, g.adapters[1], gb.adapters[1], gr.up, n.up);
    checks.add_adapter_grads(down, g.adapters[2], gb.adapters[2], gr.down, n.down);
    tb::keep_inputs(result, options, x, {{"dy", &dy}}, {&gate, &up, &down},
                    {{"dropout.x", &drop_x}, {"dropout.h", &drop_h}});
    result.checks = checks.take();
    return result;
  }
};

}  // namespace

std::unique_ptr<CaseRunner> make_mlp_runner() {
  return std::make_unique<MlpRunner>();
}

}  // namespace gradscope

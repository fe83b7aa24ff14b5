// kind = "mlp": a SwiGLU MLP (gate_proj, up_proj, down_proj) through LoRA_MLP.
#include <ATen/ATen.h>

#include "harness/aten_baseline.h"
#include "harness/lora_testbed.h"

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
    auto dy = tb::make_activation(c, "dy", hidden, false);
    auto drop_x = tb::make_dropout(c, "dropout.x", hidden);
    auto drop_h = tb::make_dropout(c, "dropout.h", inter);
    generate_time.finish("generate", result.metrics);
    tb::Measure prod_time(c);
    const auto y = lora_mlp(x.prod, gate.prod, up.prod, down.prod, drop_x.device, drop_h.device);
    const auto g =
        tb::gradients({y}, tb::leaves(x, {&gate, &up, &down}, tb::Impl::kProd), {dy.prod});
    prod_time.finish("prod", result.metrics);

    tb::Measure base_time(c);
    const auto yb =
        baseline::lora_mlp(x.base, gate.base, up.base, down.base, drop_x.device, drop_h.device);
    const auto gb =
        tb::gradients({yb}, tb::leaves(x, {&gate, &up, &down}, tb::Impl::kBase), {dy.base});
    base_time.finish("base", result.metrics);

    tb::Measure ref_time(c, /*track_memory=*/false);
    const auto yr =
        reference::mlp_forward(x.ref, gate.ref, up.ref, down.ref, drop_x.ref, drop_h.ref);
    const auto gr =
        reference::mlp_backward(x.ref, dy.ref, gate.ref, up.ref, down.ref, drop_x.ref, drop_h.ref);
    ref_time.finish("ref", result.metrics);

    tb::Checks checks(c, id + "/layer0/mlp/", options.keep_tensors);
    checks.add("down_proj", "output", y, yb, yr, c.shape(hidden));
    checks.add("gate_up_proj", "input.grad", g[0], gb[0], gr.dx, c.shape(hidden));
    checks.add_adapter_grads(gate, g[1], g[2], gb[1], gb[2], gr.gate);
    checks.add_adapter_grads(up, g[3], g[4], gb[3], gb[4], gr.up);
    checks.add_adapter_grads(down, g[5], g[6], gb[5], gb[6], gr.down);
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

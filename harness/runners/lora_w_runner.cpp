// kind = "lora_w": one fused projection (o_proj) through LoRA_W.
#include <ATen/ATen.h>

#include "harness/baseline/aten_baseline.h"
#include "harness/impl/impl_ops.h"
#include "harness/runners/lora_testbed.h"
#include "harness/runners/runner_factories.h"

namespace gradscope {
namespace {

namespace tb = lora_testbed;

class LoraWRunner final : public CaseRunner {
 public:
  std::string kind() const override { return "lora_w"; }

  std::vector<FieldSpec> fields() const override {
    std::vector<FieldSpec> f = {
        FieldSpec("in_features", FieldType::kInt, int64_t{256}, "input features (o_proj: hidden)")
            .in_range(1, 1 << 20),
        FieldSpec("out_features", FieldType::kInt, int64_t{256}, "output features")
            .in_range(1, 1 << 20),
    };
    for (auto& x : tb::fields()) f.push_back(std::move(x));
    return f;
  }

  std::string case_id(const CaseSpec& s) const override {
    return "lora_w." + s.get_string("dtype") + ".k" + std::to_string(s.get_int("in_features")) +
           "n" + std::to_string(s.get_int("out_features")) + tb::Config(s).id_suffix();
  }

  std::vector<std::string> prod_ops() const override { return {"lora_w"}; }

  double host_bytes_at_least(const CaseSpec& s) const override {
    return tb::reference_projection_bytes(s, s.get_int("in_features"), s.get_int("out_features"));
  }

  void validate(const CaseSpec& s) const override {
    tb::validate(s);
    validate_gptq_shape(s, s.get_int("in_features"), s.get_int("out_features"), "in_features",
                        "out_features");
  }

  RunOutput run(const CaseSpec& s, const std::string& id,
                const RunOptions& options) const override {
    const tb::Config c(s);
    const int64_t in = s.get_int("in_features"), out = s.get_int("out_features");
    RunOutput result;
    tb::Measure generate_time(c, /*track_memory=*/false);
    auto o = tb::make_projection(c, "o_proj", in, out);
    auto x = tb::make_activation(c, "x", in, true);
    auto dy = tb::make_output_grad(c, "dy", out);
    auto drop = tb::make_dropout(c, "dropout.x", in);

    generate_time.finish("generate", result.metrics);
    tb::Measure prod_time(c);
    const auto y = impl::Ops(options.impl).lora_w(x.prod, o.prod, c.lora_args(), drop.device);
    const auto g = tb::backward({y}, {dy.prod}, x.prod, tb::of({&o}, tb::Impl::kProd));
    prod_time.finish("prod", result.metrics);

    tb::Measure base_time(c);
    const auto yb = baseline::lora_linear(x.base, o.base, drop.device);
    const auto gb = tb::backward({yb}, {dy.base}, x.base, tb::of({&o}, tb::Impl::kBase));
    base_time.finish("base", result.metrics);

    tb::Measure ref_time(c, /*track_memory=*/false);
    const auto yr = reference::lora_forward(x.ref, o.ref, drop.ref);
    const auto gr = reference::lora_backward(x.ref, dy.ref, o.ref, drop.ref);
    ref_time.finish("ref", result.metrics);

    tb::Measure floor_time(c, /*track_memory=*/false);
    reference::RoundingNoise noise(tb::precision(c));
    const reference::Matrix exact;
    const auto fn = noise.lora_forward(x.ref, exact, o.ref, drop.ref, yr, "o_proj");
    const auto gn =
        noise.lora_backward(x.ref, exact, dy.ref, exact, o.ref, drop.ref, fn, gr, "o_proj");
    floor_time.finish("floor", result.metrics);

    tb::Checks checks(c, id + "/layer0/self_attn/", options.keep_tensors, noise);
    checks.add("o_proj", "output", {y, yb, yr, fn.y}, c.shape(out));
    checks.add("o_proj", "input.grad", {g.dx, gb.dx, gr.dx, gn.dx}, c.shape(in));
    checks.add_adapter_grads(o, g.adapters[0], gb.adapters[0], gr, gn);
    tb::keep_inputs(result, options, x, {{"dy", &dy}}, {&o}, {{"dropout.x", &drop}});
    result.checks = checks.take();
    return result;
  }
};

}  // namespace

std::unique_ptr<CaseRunner> make_lora_w_runner() {
  return std::make_unique<LoraWRunner>();
}

}  // namespace gradscope

// kind = "qkv": q_proj, k_proj, v_proj of one input through LoRA_QKV (k, v narrower
// under grouped-query attention).
#include <ATen/ATen.h>

#include "harness/baseline/aten_baseline.h"
#include "harness/impl/impl_ops.h"
#include "harness/runners/lora_testbed.h"
#include "harness/runners/runner_factories.h"

namespace gradscope {
namespace {

namespace tb = lora_testbed;

class QkvRunner final : public CaseRunner {
 public:
  std::string kind() const override { return "qkv"; }

  std::vector<FieldSpec> fields() const override {
    std::vector<FieldSpec> f = {
        FieldSpec("hidden", FieldType::kInt, int64_t{256}, "hidden size = heads * head_dim")
            .in_range(1, 1 << 20),
        FieldSpec("heads", FieldType::kInt, int64_t{4}, "query heads").in_range(1, 4096),
        FieldSpec("kv_heads", FieldType::kInt, int64_t{1}, "key/value heads (GQA)")
            .in_range(1, 4096),
    };
    for (auto& x : tb::fields()) f.push_back(std::move(x));
    return f;
  }

  std::string case_id(const CaseSpec& s) const override {
    return "qkv." + s.get_string("dtype") + ".h" + std::to_string(s.get_int("hidden")) + ".q" +
           std::to_string(s.get_int("heads")) + "kv" + std::to_string(s.get_int("kv_heads")) +
           tb::Config(s).id_suffix();
  }

  std::vector<std::string> prod_ops() const override { return {"lora_qkv"}; }

  double host_bytes_at_least(const CaseSpec& s) const override {
    const int64_t hidden = s.get_int("hidden");
    const int64_t kv_out = hidden / s.get_int("heads") * s.get_int("kv_heads");
    return tb::reference_projection_bytes(s, hidden, hidden) +
           2 * tb::reference_projection_bytes(s, hidden, kv_out);
  }

  void validate(const CaseSpec& s) const override {
    tb::validate(s);
    const int64_t hidden = s.get_int("hidden"), heads = s.get_int("heads"),
                  kv = s.get_int("kv_heads");
    if (hidden % heads != 0) {
      throw_field_error(
          s, "heads",
          "must divide hidden " + std::to_string(hidden) + ", got " + std::to_string(heads));
    }
    if (heads % kv != 0) {
      throw_field_error(s, "kv_heads",
                        "must divide heads " + std::to_string(heads) +
                            " (grouped-query attention), got " + std::to_string(kv));
    }
    validate_gptq_shape(s, hidden, hidden, "hidden", "hidden");
    validate_gptq_shape(s, hidden, hidden / heads * kv, "hidden", "kv_heads");
  }

  RunOutput run(const CaseSpec& s, const std::string& id,
                const RunOptions& options) const override {
    const tb::Config c(s);
    const int64_t hidden = s.get_int("hidden");
    const int64_t kv_out = hidden / s.get_int("heads") * s.get_int("kv_heads");
    RunOutput result;
    tb::Measure generate_time(c, /*track_memory=*/false);
    auto q = tb::make_projection(c, "q_proj", hidden, hidden);
    auto k = tb::make_projection(c, "k_proj", hidden, kv_out);
    auto v = tb::make_projection(c, "v_proj", hidden, kv_out);
    auto x = tb::make_activation(c, "x", hidden, true);
    auto dq = tb::make_output_grad(c, "dq", hidden);
    auto dk = tb::make_output_grad(c, "dk", kv_out);
    auto dv = tb::make_output_grad(c, "dv", kv_out);
    auto drop = tb::make_dropout(c, "dropout.x", hidden);
    generate_time.finish("generate", result.metrics);
    tb::Measure prod_time(c);
    const auto y = impl::Ops(options.impl)
                       .lora_qkv(x.prod, q.prod, k.prod, v.prod, c.lora_args(), drop.device);
    const auto g =
        tb::backward(y, {dq.prod, dk.prod, dv.prod}, x.prod, tb::of({&q, &k, &v}, tb::Impl::kProd));
    prod_time.finish("prod", result.metrics);

    tb::Measure base_time(c);
    const std::vector<at::Tensor> yb = {baseline::lora_linear(x.base, q.base, drop.device),
                                        baseline::lora_linear(x.base, k.base, drop.device),
                                        baseline::lora_linear(x.base, v.base, drop.device)};
    const auto gb = tb::backward(yb, {dq.base, dk.base, dv.base}, x.base,
                                 tb::of({&q, &k, &v}, tb::Impl::kBase));
    base_time.finish("base", result.metrics);

    tb::Measure ref_time(c, /*track_memory=*/false);
    const auto yr = reference::qkv_forward(x.ref, q.ref, k.ref, v.ref, drop.ref);
    const auto gr =
        reference::qkv_backward(x.ref, dq.ref, dk.ref, dv.ref, q.ref, k.ref, v.ref, drop.ref);
    ref_time.finish("ref", result.metrics);

    tb::Measure floor_time(c, /*track_memory=*/false);
    reference::RoundingNoise noise(tb::precision(c));
    const auto n = noise.qkv(x.ref, dq.ref, dk.ref, dv.ref, q.ref, k.ref, v.ref, drop.ref, yr, gr);
    floor_time.finish("floor", result.metrics);

    tb::Checks checks(c, id + "/layer0/self_attn/", options.keep_tensors, noise);
    checks.add("q_proj", "output", {y[0], yb[0], yr.q, n.q}, c.shape(hidden));
    checks.add("k_proj", "output", {y[1], yb[1], yr.k, n.k}, c.shape(kv_out));
    checks.add("v_proj", "output", {y[2], yb[2], yr.v, n.v}, c.shape(kv_out));
    checks.add("qkv_proj", "input.grad", {g.dx, gb.dx, gr.dx, n.dx}, c.shape(hidden));
    checks.add_adapter_grads(q, g.adapters[0], gb.adapters[0], gr.q, n.gq);
    checks.add_adapter_grads(k, g.adapters[1], gb.adapters[1], gr.k, n.gk);
    checks.add_adapter_grads(v, g.adapters[2], gb.adapters[2], gr.v, n.gv);
    tb::keep_inputs(result, options, x, {{"dq", &dq}, {"dk", &dk}, {"dv", &dv}}, {&q, &k, &v},
                    {{"dropout.x", &drop}});
    result.checks = checks.take();
    return result;
  }
};

}  // namespace

std::unique_ptr<CaseRunner> make_qkv_runner() {
  return std::make_unique<QkvRunner>();
}

}  // namespace gradscope

// kind = "qkv": q_proj, k_proj, v_proj of one input through LoRA_QKV (k, v narrower
// under grouped-query attention).
#include <ATen/ATen.h>

#include "harness/aten_baseline.h"
#include "harness/lora_testbed.h"

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
    auto dq = tb::make_activation(c, "dq", hidden, false);
    auto dk = tb::make_activation(c, "dk", kv_out, false);
    auto dv = tb::make_activation(c, "dv", kv_out, false);
    auto drop = tb::make_dropout(c, "dropout.x", hidden);
    generate_time.finish("generate", result.metrics);
    tb::Measure prod_time(c);
    const auto y = lora_qkv(x.prod, q.prod, k.prod, v.prod, drop.device);
    const auto g =
        tb::gradients(y, tb::leaves(x, {&q, &k, &v}, tb::Impl::kProd), {dq.prod, dk.prod, dv.prod});
    prod_time.finish("prod", result.metrics);

    tb::Measure base_time(c);
    const std::vector<at::Tensor> yb = {baseline::lora_linear(x.base, q.base, drop.device),
                                        baseline::lora_linear(x.base, k.base, drop.device),
                                        baseline::lora_linear(x.base, v.base, drop.device)};
    const auto gb = tb::gradients(yb, tb::leaves(x, {&q, &k, &v}, tb::Impl::kBase),
                                  {dq.base, dk.base, dv.base});
    base_time.finish("base", result.metrics);

    tb::Measure ref_time(c, /*track_memory=*/false);
    const auto yr = reference::qkv_forward(x.ref, q.ref, k.ref, v.ref, drop.ref);
    const auto gr =
        reference::qkv_backward(x.ref, dq.ref, dk.ref, dv.ref, q.ref, k.ref, v.ref, drop.ref);
    ref_time.finish("ref", result.metrics);

    tb::Checks checks(c, id + "/layer0/self_attn/", options.keep_tensors);
    checks.add("q_proj", "output", y[0], yb[0], yr.q, c.shape(hidden));
    checks.add("k_proj", "output", y[1], yb[1], yr.k, c.shape(kv_out));
    checks.add("v_proj", "output", y[2], yb[2], yr.v, c.shape(kv_out));
    checks.add("qkv_proj", "input.grad", g[0], gb[0], gr.dx, c.shape(hidden));
    checks.add_adapter_grads(q, g[1], g[2], gb[1], gb[2], gr.q);
    checks.add_adapter_grads(k, g[3], g[4], gb[3], gb[4], gr.k);
    checks.add_adapter_grads(v, g[5], g[6], gb[5], gb[6], gr.v);
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

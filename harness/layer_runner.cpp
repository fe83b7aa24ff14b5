// kind = "layer": a stack of Llama decoder layers (RMSNorm, LoRA_QKV, RoPE, causal GQA
// attention, LoRA_W, LoRA_MLP, residuals), checked layer by layer: each layer's output,
// the gradient of its input hidden state and every adapter gradient.
#include <ATen/ATen.h>

#include "gradscope/decoder_layer.h"
#include "harness/aten_baseline.h"
#include "harness/lora_testbed.h"
#include "harness/seeded_streams.h"
#include "harness/tensor_bridge.h"
#include "reference/layer_reference.h"

namespace gradscope {
namespace {

namespace tb = lora_testbed;

constexpr double kNormEps = 1e-5;

struct StackLayer {
  std::vector<tb::Projection> projections;  // q k v o gate up down
  at::Tensor input_norm, post_attention_norm;
  reference::Layer ref;
};

class LayerRunner final : public CaseRunner {
 public:
  std::string kind() const override { return "layer"; }

  std::vector<FieldSpec> fields() const override {
    std::vector<FieldSpec> f = {
        FieldSpec("hidden", FieldType::kInt, int64_t{128}, "hidden size = heads * head_dim")
            .in_range(1, 1 << 16),
        FieldSpec("intermediate", FieldType::kInt, int64_t{256}, "MLP intermediate size")
            .in_range(1, 1 << 17),
        FieldSpec("heads", FieldType::kInt, int64_t{4}, "query heads").in_range(1, 1024),
        FieldSpec("kv_heads", FieldType::kInt, int64_t{2}, "key/value heads (GQA)")
            .in_range(1, 1024),
        FieldSpec("layers", FieldType::kInt, int64_t{2}, "decoder layers in the stack")
            .in_range(1, 128),
    };
    for (auto& x : tb::fields()) f.push_back(std::move(x));
    return f;
  }

  std::string case_id(const CaseSpec& s) const override {
    return "layer." + s.get_string("dtype") + ".h" + std::to_string(s.get_int("hidden")) + "i" +
           std::to_string(s.get_int("intermediate")) + ".q" + std::to_string(s.get_int("heads")) +
           "kv" + std::to_string(s.get_int("kv_heads")) + ".L" +
           std::to_string(s.get_int("layers")) + tb::Config(s).id_suffix();
  }

  void validate(const CaseSpec& s) const override {
    tb::validate(s);
    const int64_t hidden = s.get_int("hidden"), heads = s.get_int("heads"),
                  kv = s.get_int("kv_heads"), inter = s.get_int("intermediate");
    if (hidden % heads != 0 || (hidden / heads) % 2 != 0) {
      throw_field_error(s, "heads",
                        "must divide hidden " + std::to_string(hidden) +
                            " into heads of even width (RoPE pairs), got " + std::to_string(heads));
    }
    if (heads % kv != 0) {
      throw_field_error(
          s, "kv_heads",
          "must divide heads " + std::to_string(heads) + ", got " + std::to_string(kv));
    }
    if (s.get_float("dropout") != 0.0) {
      throw_field_error(s, "dropout", "must be 0 for kind layer (dropout is checked per op)");
    }
    if (s.get_int("batch") == 0) {
      throw_field_error(s, "batch",
                        "must be at least 1 for kind layer (attention needs [batch, seq])");
    }
    validate_gptq_shape(s, hidden, hidden, "hidden", "hidden");
    validate_gptq_shape(s, hidden, hidden / heads * kv, "hidden", "kv_heads");
    validate_gptq_shape(s, hidden, inter, "hidden", "intermediate");
    validate_gptq_shape(s, inter, hidden, "intermediate", "hidden");
  }

  RunOutput run(const CaseSpec& s, const std::string& id,
                const RunOptions& options) const override {
    const tb::Config c(s);
    const int64_t hidden = s.get_int("hidden"), inter = s.get_int("intermediate");
    const int64_t heads = s.get_int("heads"), kv_heads = s.get_int("kv_heads");
    const int64_t n_layers = s.get_int("layers");
    const int64_t kv_out = hidden / heads * kv_heads;
    const reference::AttentionShape shape{c.batch, c.seq, heads, kv_heads, hidden / heads};
    RunOutput result;

    tb::Measure generate_time(c, /*track_memory=*/false);
    std::vector<StackLayer> stack(n_layers);
    for (int64_t i = 0; i < n_layers; ++i) {
      auto& L = stack[i];
      const std::pair<const char*, std::pair<int64_t, int64_t>> shapes[] = {
          {"q_proj", {hidden, hidden}},   {"k_proj", {hidden, kv_out}},
          {"v_proj", {hidden, kv_out}},   {"o_proj", {hidden, hidden}},
          {"gate_proj", {hidden, inter}}, {"up_proj", {hidden, inter}},
          {"down_proj", {inter, hidden}}};
      for (const auto& [name, io] : shapes) {
        L.projections.push_back(tb::make_projection(c, name, io.first, io.second, i + 1));
      }
      const auto norm = [&](const char* name) {
        const std::string stream = "layers." + std::to_string(i + 1) + "." + name;
        return (normal_tensor(c.seed, stream, {hidden}, 0.1) + 1.0).to(c.dtype);
      };
      L.input_norm = norm("input_norm");
      L.post_attention_norm = norm("post_attention_norm");
      L.ref.input_norm = {bridge::to_matrix(L.input_norm.to(at::kDouble).view({1, hidden})).row(0),
                          kNormEps};
      L.ref.post_attention_norm = {
          bridge::to_matrix(L.post_attention_norm.to(at::kDouble).view({1, hidden})).row(0),
          kNormEps};
      auto& p = L.projections;
      L.ref.q = p[0].ref, L.ref.k = p[1].ref, L.ref.v = p[2].ref, L.ref.o = p[3].ref;
      L.ref.gate = p[4].ref, L.ref.up = p[5].ref, L.ref.down = p[6].ref;
    }
    auto x = tb::make_activation(c, "x", hidden, true);
    auto dy = tb::make_activation(c, "dy", hidden, false);
    generate_time.finish("generate", result.metrics);

    // The reference runs the stack; every layer of prod and base then starts from the
    // reference's input of that layer and output gradient, rounded to the case dtype, like
    // the single-op kinds. Rounding noise accumulated through a stack is different but
    // equally valid in prod and base, and comparing it made correct fp32 kernels fail
    // (2 seeds in 60 when each implementation ran the stack end to end).
    tb::Measure ref_time(c, /*track_memory=*/false);
    std::vector<reference::Matrix> ref_inputs;
    reference::Matrix hr = x.ref;
    for (const auto& L : stack) {
      ref_inputs.push_back(hr);
      hr = reference::layer_forward(hr, L.ref, shape);
    }
    std::vector<reference::LayerGrads> ref_grads(n_layers);
    std::vector<reference::Matrix> ref_dys(n_layers);
    reference::Matrix dh = dy.ref;
    for (int64_t i = n_layers - 1; i >= 0; --i) {
      ref_dys[i] = dh;
      ref_grads[i] = reference::layer_backward(ref_inputs[i], dh, stack[i].ref, shape);
      dh = ref_grads[i].dx;
    }
    ref_time.finish("ref", result.metrics);

    // Layer i's input and output gradient in the case dtype, as prod and base see them
    // (i = 0 is the generated x and dy of the last layer is the generated dy); the
    // reference is re-run from these rounded values so all three judge the same problem.
    const auto as_input = [&](const reference::Matrix& m, bool grad) {
      return bridge::to_tensor(m)
          .to(c.dtype)
          .reshape(c.shape(hidden))
          .to(c.device)
          .requires_grad_(grad);
    };
    // output, d(input), then dA and dB of each projection; one entry per layer.
    const auto pass = [&](tb::Impl impl, int64_t i, const at::Tensor& h, const at::Tensor& dy_i) {
      const bool prod = impl == tb::Impl::kProd;
      const auto& L = stack[i];
      DecoderLayer d;
      d.input_norm = L.input_norm.to(c.device);
      d.post_attention_norm = L.post_attention_norm.to(c.device);
      d.norm_eps = kNormEps;
      d.heads = heads;
      d.kv_heads = kv_heads;
      LoraProjection* slots[] = {&d.q, &d.k, &d.v, &d.o, &d.gate, &d.up, &d.down};
      std::vector<at::Tensor> wrt = {h};
      for (size_t j = 0; j < 7; ++j) {
        *slots[j] = prod ? L.projections[j].prod : L.projections[j].base;
        wrt.push_back(slots[j]->lora_A);
        wrt.push_back(slots[j]->lora_B);
      }
      const auto out = prod ? decoder_layer(h, d) : baseline::decoder_layer(h, d);
      auto grads = tb::gradients({out}, wrt, {dy_i});
      grads.insert(grads.begin(), out.detach());
      return grads;
    };
    std::vector<std::vector<at::Tensor>> g(n_layers), gb(n_layers);
    std::vector<reference::Matrix> ref_out(n_layers);
    tb::Measure prod_time(c);
    for (int64_t i = 0; i < n_layers; ++i) {
      const auto h = i == 0 ? x.prod : as_input(ref_inputs[i], true);
      g[i] = pass(tb::Impl::kProd, i, h, i + 1 == n_layers ? dy.prod : as_input(ref_dys[i], false));
    }
    prod_time.finish("prod", result.metrics);
    tb::Measure base_time(c);
    for (int64_t i = 0; i < n_layers; ++i) {
      const auto h = i == 0 ? x.base : as_input(ref_inputs[i], true);
      gb[i] =
          pass(tb::Impl::kBase, i, h, i + 1 == n_layers ? dy.base : as_input(ref_dys[i], false));
    }
    base_time.finish("base", result.metrics);
    tb::Measure ref_layers_time(c, /*track_memory=*/false);
    for (int64_t i = 0; i < n_layers; ++i) {
      // The reference of layer i on exactly the rounded input and gradient prod saw.
      const auto h =
          i == 0 ? x.ref
                 : bridge::to_matrix(
                       as_input(ref_inputs[i], false).cpu().to(at::kDouble).reshape({-1, hidden}));
      const auto dyi =
          i + 1 == n_layers
              ? dy.ref
              : bridge::to_matrix(
                    as_input(ref_dys[i], false).cpu().to(at::kDouble).reshape({-1, hidden}));
      ref_out[i] = reference::layer_forward(h, stack[i].ref, shape);
      ref_grads[i] = reference::layer_backward(h, dyi, stack[i].ref, shape);
    }
    ref_layers_time.finish("ref_layers", result.metrics);

    std::vector<report::Check> checks;
    const auto append = [&](tb::Checks& part) {
      for (auto& check : part.take()) checks.push_back(std::move(check));
    };
    for (int64_t i = 0; i < n_layers; ++i) {
      const std::string layer = id + "/layer" + std::to_string(i) + "/";
      tb::Checks block(c, layer, options.keep_tensors);
      block.add("hidden", "output", g[i][0], gb[i][0], ref_out[i], c.shape(hidden));
      block.add("hidden", "input.grad", g[i][1], gb[i][1], ref_grads[i].dx, c.shape(hidden));
      append(block);
      tb::Checks attn(c, layer + "self_attn/", options.keep_tensors);
      tb::Checks mlp(c, layer + "mlp/", options.keep_tensors);
      const reference::ProjectionGrads* refs[] = {
          &ref_grads[i].q,    &ref_grads[i].k,  &ref_grads[i].v,   &ref_grads[i].o,
          &ref_grads[i].gate, &ref_grads[i].up, &ref_grads[i].down};
      for (size_t j = 0; j < 7; ++j) {
        const size_t at = 2 + 2 * j;
        (j < 4 ? attn : mlp)
            .add_adapter_grads(stack[i].projections[j], g[i][at], g[i][at + 1], gb[i][at],
                               gb[i][at + 1], *refs[j]);
      }
      append(attn);
      append(mlp);
    }
    // Adapters are not dumped: every layer repeats the projection names.
    tb::keep_inputs(result, options, x, {{"dy", &dy}}, {}, {});
    result.checks = std::move(checks);
    return result;
  }
};

}  // namespace

std::unique_ptr<CaseRunner> make_layer_runner() {
  return std::make_unique<LayerRunner>();
}

}  // namespace gradscope

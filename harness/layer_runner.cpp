// kind = "layer": a stack of Llama decoder layers (RMSNorm, LoRA_QKV, RoPE, causal GQA
// attention, LoRA_W, LoRA_MLP, residuals), checked layer by layer: each layer's output,
// the gradient of its input hidden state and every adapter gradient.
#include <ATen/ATen.h>

#include "gradscope/decoder_layer.h"
#include "harness/aten_baseline.h"
#include "harness/decoder_stack.h"
#include "harness/lora_testbed.h"
#include "harness/tensor_bridge.h"
#include "reference/layer_reference.h"

namespace gradscope {
namespace {

namespace tb = lora_testbed;
namespace ds = decoder_stack;

class LayerRunner final : public CaseRunner {
 public:
  std::string kind() const override { return "layer"; }

  std::vector<FieldSpec> fields() const override {
    auto f = ds::fields();
    for (auto& x : tb::fields()) f.push_back(std::move(x));
    return f;
  }

  std::string case_id(const CaseSpec& s) const override {
    return "layer." + s.get_string("dtype") + "." + ds::Dims(s).id_part() +
           tb::Config(s).id_suffix();
  }

  void validate(const CaseSpec& s) const override { ds::validate(s, kind()); }

  RunOutput run(const CaseSpec& s, const std::string& id,
                const RunOptions& options) const override {
    const tb::Config c(s);
    const ds::Dims dims(s);
    const int64_t hidden = dims.hidden, n_layers = dims.layers;
    const auto shape = dims.attention(c);
    RunOutput result;

    tb::Measure generate_time(c, /*track_memory=*/false);
    const auto stack = ds::make_stack(c, dims);
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
    std::vector<reference::LayerTape> tapes;  // each layer's forward runs once
    reference::Matrix hr = x.ref;
    for (const auto& L : stack) {
      ref_inputs.push_back(hr);
      tapes.push_back(reference::layer_tape(hr, L.ref, shape));
      hr = tapes.back().out;
    }
    std::vector<reference::LayerGrads> ref_grads(n_layers);
    std::vector<reference::Matrix> ref_dys(n_layers);
    reference::Matrix dh = dy.ref;
    for (int64_t i = n_layers - 1; i >= 0; --i) {
      ref_dys[i] = dh;
      ref_grads[i] = reference::layer_backward(tapes[i], ref_inputs[i], dh, stack[i].ref, shape);
      dh = ref_grads[i].dx;
    }
    tapes.clear();
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
    // Building a layer's device modules from the host tensors is part of each pass; it is
    // also timed on its own (prod.setup_seconds, base.setup_seconds) so the phase shows how
    // much is setup rather than forward + backward.
    double setup_seconds[2] = {0, 0};
    // output, d(input), then dA and dB of each projection; one entry per layer.
    const auto pass = [&](tb::Impl impl, int64_t i, const at::Tensor& h, const at::Tensor& dy_i) {
      const bool prod = impl == tb::Impl::kProd;
      std::vector<std::pair<std::string, double>> setup;
      tb::Measure setup_time(c, /*track_memory=*/false);
      const auto d = ds::device_layer(c, dims, stack[i], impl);
      setup_time.finish("setup", setup);
      setup_seconds[prod ? 0 : 1] += setup.back().second;
      const LoraProjection* slots[] = {&d.q, &d.k, &d.v, &d.o, &d.gate, &d.up, &d.down};
      std::vector<at::Tensor> wrt = {h};
      for (const auto* slot : slots) {
        wrt.push_back(slot->lora_A);
        wrt.push_back(slot->lora_B);
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
    result.metrics.emplace_back("prod.setup_seconds", setup_seconds[0]);
    tb::Measure base_time(c);
    for (int64_t i = 0; i < n_layers; ++i) {
      const auto h = i == 0 ? x.base : as_input(ref_inputs[i], true);
      gb[i] =
          pass(tb::Impl::kBase, i, h, i + 1 == n_layers ? dy.base : as_input(ref_dys[i], false));
    }
    base_time.finish("base", result.metrics);
    result.metrics.emplace_back("base.setup_seconds", setup_seconds[1]);
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
      // Layer 0 starts from the generated x itself and the last layer ends at the
      // generated dy: where nothing was rounded, the first run's results stand.
      ref_out[i] = i == 0 ? (n_layers > 1 ? ref_inputs[1] : hr)
                          : reference::layer_forward(h, stack[i].ref, shape);
      if (i > 0 || i + 1 < n_layers) {
        ref_grads[i] = reference::layer_backward(h, dyi, stack[i].ref, shape);
      }
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

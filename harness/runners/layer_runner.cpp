// kind = "layer": a stack of Llama decoder layers (RMSNorm, LoRA_QKV, RoPE, causal GQA
// attention, LoRA_W, LoRA_MLP, residuals), checked layer by layer: each layer's output,
// the gradient of its input hidden state and every adapter gradient.
#include <ATen/ATen.h>

#include "gradscope/decoder_layer.h"
#include "harness/baseline/aten_baseline.h"
#include "harness/common/tensor_bridge.h"
#include "harness/runners/decoder_stack.h"
#include "harness/runners/lora_testbed.h"
#include "harness/runners/runner_factories.h"
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

  std::vector<std::string> prod_ops() const override { return {"lora_qkv", "lora_w", "lora_mlp"}; }

  double host_bytes_at_least(const CaseSpec& s) const override {
    return ds::stack_reference_bytes(s);
  }

  void validate(const CaseSpec& s) const override { ds::validate(s, kind()); }

  RunOutput run(const CaseSpec& s, const std::string& id,
                const RunOptions& options) const override {
    const tb::Config c(s);
    const ds::Dims dims(s);
    const int64_t hidden = dims.hidden, n_layers = dims.layers;
    const auto shape = dims.attention(c);
    RunOutput result;
    result.metrics.emplace_back("inputs.first_position",
                                static_cast<double>(shape.position_offset));

    tb::Measure generate_time(c, /*track_memory=*/false);
    const auto stack = ds::make_stack(c, dims);
    auto x = tb::make_activation(c, "x", hidden, true);
    auto dy = tb::make_output_grad(c, "dy", hidden);
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
    std::vector<reference::Matrix> ref_dys(n_layers);
    reference::Matrix dh = dy.ref;
    for (int64_t i = n_layers - 1; i >= 0; --i) {
      ref_dys[i] = dh;
      dh = reference::layer_backward(tapes[i], ref_inputs[i], dh, stack[i].ref, shape).dx;
    }
    tapes.resize(1);  // layer 0's input is the generated x itself: its tape stands
    ref_time.finish("ref", result.metrics);

    // Layer i's input and output gradient in the case dtype, as prod and base see them
    // (i = 0 is the generated x and dy of the last layer is the generated dy); the
    // reference is re-run from these rounded values so all three judge the same problem.
    const auto rounded = [&](const reference::Matrix& m) {
      return bridge::to_tensor(m).to(c.dtype).reshape(c.shape(hidden));
    };
    std::vector<reference::Matrix> inputs(n_layers), dys(n_layers);
    for (int64_t i = 0; i < n_layers; ++i) {
      const auto as_matrix = [&](const at::Tensor& t) {
        return bridge::to_matrix(t.to(at::kDouble).reshape({-1, hidden}));
      };
      inputs[i] = i == 0 ? x.ref : as_matrix(rounded(ref_inputs[i]));
      dys[i] = i + 1 == n_layers ? dy.ref : as_matrix(rounded(ref_dys[i]));
    }
    ref_inputs.clear();
    ref_dys.clear();
    // Building a layer's device modules from the host tensors is part of each pass; it is
    // also timed on its own (prod.setup_seconds, base.setup_seconds) so the phase shows how
    // much is setup rather than forward + backward.
    double setup_seconds[2] = {0, 0};
    struct Pass {
      at::Tensor out;
      tb::Gradients grads;
    };
    const auto prod_ops = impl::layer_ops(impl::Ops(options.impl), c.lora_args());
    const auto pass = [&](tb::Impl impl, int64_t i) {
      const bool prod = impl == tb::Impl::kProd;
      const auto& own = prod ? x.prod : x.base;
      const auto h = i == 0 ? own : rounded(inputs[i]).to(c.device).requires_grad_(true);
      const auto dy_i =
          i + 1 == n_layers ? (prod ? dy.prod : dy.base) : rounded(dys[i]).to(c.device);
      std::vector<std::pair<std::string, double>> setup;
      tb::Measure setup_time(c, /*track_memory=*/false);
      const auto d = ds::device_layer(c, dims, stack[i], impl, shape.position_offset);
      setup_time.finish("setup", setup);
      setup_seconds[prod ? 0 : 1] += setup.back().second;
      const auto out = prod ? decoder_layer(h, d, prod_ops) : baseline::decoder_layer(h, d);
      return Pass{out.detach(), tb::backward({out}, {dy_i}, h,
                                             {&d.q, &d.k, &d.v, &d.o, &d.gate, &d.up, &d.down})};
    };
    std::vector<Pass> prod(n_layers), base(n_layers);
    tb::Measure prod_time(c);
    for (int64_t i = 0; i < n_layers; ++i) prod[i] = pass(tb::Impl::kProd, i);
    prod_time.finish("prod", result.metrics);
    result.metrics.emplace_back("prod.setup_seconds", setup_seconds[0]);
    tb::Measure base_time(c);
    for (int64_t i = 0; i < n_layers; ++i) base[i] = pass(tb::Impl::kBase, i);
    base_time.finish("base", result.metrics);
    result.metrics.emplace_back("base.setup_seconds", setup_seconds[1]);

    // The reference of layer i on exactly the rounded input and gradient prod saw, and the
    // rounding noise of a careful implementation on that problem.
    std::vector<reference::Matrix> ref_out(n_layers);
    std::vector<reference::LayerGrads> ref_grads(n_layers);
    std::vector<reference::LayerNoise> noise_of(n_layers);
    reference::RoundingNoise noise(tb::precision(c));
    double floor_seconds = 0;
    tb::Measure ref_layers_time(c, /*track_memory=*/false);
    for (int64_t i = 0; i < n_layers; ++i) {
      const auto tape =
          i == 0 ? std::move(tapes[0]) : reference::layer_tape(inputs[i], stack[i].ref, shape);
      ref_out[i] = tape.out;
      ref_grads[i] = reference::layer_backward(tape, inputs[i], dys[i], stack[i].ref, shape);
      std::vector<std::pair<std::string, double>> floor;
      tb::Measure floor_time(c, /*track_memory=*/false);
      noise_of[i] = noise.layer(tape, inputs[i], dys[i], stack[i].ref, shape, ref_grads[i],
                                "layer" + std::to_string(i));
      floor_time.finish("floor", floor);
      floor_seconds += floor.back().second;
    }
    ref_layers_time.finish("ref_layers", result.metrics);
    result.metrics.emplace_back("floor.seconds", floor_seconds);

    std::vector<report::Check> checks;
    const auto append = [&](tb::Checks& part) {
      for (auto& check : part.take()) checks.push_back(std::move(check));
    };
    for (int64_t i = 0; i < n_layers; ++i) {
      const std::string layer = id + "/layer" + std::to_string(i) + "/";
      const auto &g = prod[i], &gb = base[i];
      const auto& n = noise_of[i];
      tb::Checks block(c, layer, options.keep_tensors, noise);
      block.add("hidden", "output", {g.out, gb.out, ref_out[i], n.out}, c.shape(hidden));
      block.add("hidden", "input.grad", {g.grads.dx, gb.grads.dx, ref_grads[i].dx, n.dx},
                c.shape(hidden));
      append(block);
      tb::Checks attn(c, layer + "self_attn/", options.keep_tensors, noise);
      tb::Checks mlp(c, layer + "mlp/", options.keep_tensors, noise);
      const reference::ProjectionGrads* refs[] = {
          &ref_grads[i].q,    &ref_grads[i].k,  &ref_grads[i].v,   &ref_grads[i].o,
          &ref_grads[i].gate, &ref_grads[i].up, &ref_grads[i].down};
      const reference::ProjectionGradsNoise* noises[] = {&n.q,    &n.k,  &n.v,   &n.o,
                                                         &n.gate, &n.up, &n.down};
      for (size_t j = 0; j < 7; ++j) {
        (j < 4 ? attn : mlp)
            .add_adapter_grads(stack[i].projections[j], g.grads.adapters[j], gb.grads.adapters[j],
                               *refs[j], *noises[j]);
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

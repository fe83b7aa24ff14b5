// kind = "mlp": a SwiGLU MLP (gate_proj, up_proj, down_proj) through LoRA_MLP.
#include <ATen/ATen.h>

#include "harness/baseline/aten_baseline.h"
#include "harness/kinds/field_draws.h"
#include "harness/kinds/kind_decls.h"
#include "harness/kinds/lora_op_kind.h"

namespace gradscope {

KindDecl mlp_kind() {
  using namespace lora_testbed;
  LoraOpDecl k;
  k.kind = "mlp";
  k.module = "mlp";
  k.fields = {
      FieldSpec("hidden", FieldType::kInt, int64_t{256}, "hidden size").in_range(1, 1 << 20),
      FieldSpec("intermediate", FieldType::kInt, int64_t{688}, "intermediate size")
          .in_range(1, 1 << 20),
  };
  k.prod_ops = {"lora_mlp"};
  k.id_part = [](const CaseSpec& s) {
    return "h" + std::to_string(s.get_int("hidden")) + "i" +
           std::to_string(s.get_int("intermediate"));
  };
  k.shape = [](const CaseSpec& s) {
    const int64_t h = s.get_int("hidden"), i = s.get_int("intermediate");
    return LoraOpShape{{{"gate_proj", h, i, "hidden", "intermediate"},
                        {"up_proj", h, i, "hidden", "intermediate"},
                        {"down_proj", i, h, "intermediate", "hidden"}},
                       h,
                       "gate_up_proj",
                       {{"down_proj", "dy", h}},
                       {{"dropout.x", h}, {"dropout.h", i}}};
  };
  k.prod = [](const impl::Ops& ops, const OpArgs& a) {
    return Named<at::Tensor>{
        {"down_proj", ops.lora_mlp(a.x, a.projection("gate_proj"), a.projection("up_proj"),
                                   a.projection("down_proj"), a.lora, a.dropout("dropout.x"),
                                   a.dropout("dropout.h"))}};
  };
  k.base = [](const OpArgs& a) {
    return Named<at::Tensor>{
        {"down_proj", baseline::lora_mlp(a.x, a.projection("gate_proj"), a.projection("up_proj"),
                                         a.projection("down_proj"), a.dropout("dropout.x"),
                                         a.dropout("dropout.h"))}};
  };
  struct Ref {
    reference::MlpTape tape;
    reference::Matrix y;
    reference::MlpGrads g;
  };
  k.ref = [](const RefArgs& a) {
    const auto &gate = a.projection("gate_proj"), &up = a.projection("up_proj"),
               &down = a.projection("down_proj");
    const auto &dx = a.dropout("dropout.x"), &dh = a.dropout("dropout.h");
    RefResult r;
    auto& v = r.own(Ref{reference::mlp_tape(a.x, gate, up, dx), {}, {}});
    v.y = reference::lora_forward(reference::swiglu(v.tape.e, v.tape.g), down, dh);
    v.g = reference::mlp_backward(v.tape, a.x, a.output_grad("dy"), gate, up, down, dx, dh);
    r.outputs = {{"down_proj", &v.y}};
    r.dx = &v.g.dx;
    r.grads = {{"gate_proj", &v.g.gate}, {"up_proj", &v.g.up}, {"down_proj", &v.g.down}};
    return r;
  };
  k.floor = [](reference::RoundingNoise& noise, const RefArgs& a, const RefResult& r) {
    const auto& ref = r.as<Ref>();
    FloorResult f;
    auto& n = f.own(noise.mlp(ref.tape, a.x, a.output_grad("dy"), a.projection("gate_proj"),
                              a.projection("up_proj"), a.projection("down_proj"),
                              a.dropout("dropout.x"), a.dropout("dropout.h"), ref.y, ref.g));
    f.outputs = {{"down_proj", &n.y}};
    f.dx = &n.dx;
    f.grads = {{"gate_proj", &n.gate}, {"up_proj", &n.up}, {"down_proj", &n.down}};
    return f;
  };
  k.sample = [](CaseDraw& d) {
    const int64_t bits = field_draws::gptq(d);
    d.set("hidden", field_draws::width(d, bits, 64, 384));
    d.set("intermediate", field_draws::width(d, bits, 64, 768));
    field_draws::lora(d, true, true, 256);
  };
  return lora_op_kind(std::move(k));
}

}  // namespace gradscope

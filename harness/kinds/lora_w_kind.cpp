// kind = "lora_w": one fused projection (o_proj) through LoRA_W.
#include <ATen/ATen.h>

#include "harness/kinds/kind_decls.h"
#include "harness/kinds/lora_op_kind.h"

namespace gradscope {

KindDecl lora_w_kind() {
  using namespace lora_testbed;
  LoraOpDecl k;
  k.kind = "lora_w";
  k.module = "self_attn";
  k.fields = {
      FieldSpec("in_features", FieldType::kInt, int64_t{256}, "input features (o_proj: hidden)")
          .in_range(1, 1 << 20),
      FieldSpec("out_features", FieldType::kInt, int64_t{256}, "output features")
          .in_range(1, 1 << 20),
  };
  k.prod_ops = {"lora_w"};
  k.id_part = [](const CaseSpec& s) {
    return "k" + std::to_string(s.get_int("in_features")) + "n" +
           std::to_string(s.get_int("out_features"));
  };
  k.shape = [](const CaseSpec& s) {
    const int64_t in = s.get_int("in_features"), out = s.get_int("out_features");
    return LoraOpShape{{{"o_proj", in, out, "in_features", "out_features"}},
                       in,
                       "o_proj",
                       {{"o_proj", "dy", out}},
                       {{"dropout.x", in}}};
  };
  k.prod = [](const impl::Ops& ops, const OpArgs& a) {
    return Named<at::Tensor>{
        {"o_proj", ops.lora_w(a.x, a.projection("o_proj"), a.lora, a.dropout("dropout.x"))}};
  };
  struct Ref {
    reference::Matrix y;
    reference::ProjectionGrads g;
  };
  k.ref = [](const RefArgs& a) {
    const auto& o = a.projection("o_proj");
    const auto& drop = a.dropout("dropout.x");
    RefResult r;
    auto& v = r.own(Ref{reference::lora_forward(a.x, o, drop),
                        reference::lora_backward(a.x, a.output_grad("dy"), o, drop)});
    r.outputs = {{"o_proj", &v.y}};
    r.dx = &v.g.dx;
    r.grads = {{"o_proj", &v.g}};
    return r;
  };
  struct Floor {
    reference::ProjectionForwardNoise y;
    reference::ProjectionGradsNoise g;
  };
  k.floor = [](reference::RoundingNoise& noise, const RefArgs& a, const RefResult& r) {
    const auto& o = a.projection("o_proj");
    const auto& drop = a.dropout("dropout.x");
    const auto& ref = r.as<Ref>();
    const reference::Matrix exact;
    FloorResult f;
    auto& v = f.own(Floor{noise.lora_forward(a.x, exact, o, drop, ref.y, "o_proj"), {}});
    v.g =
        noise.lora_backward(a.x, exact, a.output_grad("dy"), exact, o, drop, v.y, ref.g, "o_proj");
    f.outputs = {{"o_proj", &v.y.y}};
    f.dx = &v.g.dx;
    f.grads = {{"o_proj", &v.g}};
    return f;
  };
  return lora_op_kind(std::move(k));
}

}  // namespace gradscope

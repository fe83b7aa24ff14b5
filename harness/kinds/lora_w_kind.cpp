// kind = "lora_w": one fused projection (o_proj) through LoRA_W.
#include <ATen/ATen.h>

#include "harness/kinds/field_draws.h"
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
  k.sample = [](CaseDraw& d) {
    const int64_t bits = field_draws::gptq(d);
    d.set("in_features", field_draws::width(d, bits, 32, 512));
    d.set("out_features", field_draws::width(d, bits, 32, 512));
    field_draws::lora(d, true, true, 256);
  };
  return lora_op_kind(std::move(k));
}

}  // namespace gradscope

// kind = "mlp": a SwiGLU MLP (gate_proj, up_proj, down_proj) through LoRA_MLP.
#include <ATen/ATen.h>

#include "harness/kinds/field_draws.h"
#include "harness/kinds/kind_decls.h"
#include "harness/kinds/lora_op_kind.h"

namespace gradscope {

KindDecl mlp_kind() {
  using namespace lora_testbed;
  LoraOpDecl k;
  k.kind = "mlp";
  k.body = LoraOpDecl::Body::kSwigluMlp;
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
  k.sample = [](CaseDraw& d) {
    const int64_t bits = field_draws::gptq(d);
    d.set("hidden", field_draws::width(d, bits, 64, 384));
    d.set("intermediate", field_draws::width(d, bits, 64, 768));
    field_draws::lora(d, true, true, 256);
  };
  return lora_op_kind(std::move(k));
}

}  // namespace gradscope

// kind = "qkv": q_proj, k_proj, v_proj of one input through LoRA_QKV (k, v narrower
// under grouped-query attention).
#include <ATen/ATen.h>

#include "harness/kinds/field_draws.h"
#include "harness/kinds/kind_decls.h"
#include "harness/kinds/lora_op_kind.h"

namespace gradscope {

KindDecl qkv_kind() {
  using namespace lora_testbed;
  LoraOpDecl k;
  k.kind = "qkv";
  k.module = "self_attn";
  k.fields = {
      FieldSpec("hidden", FieldType::kInt, int64_t{256}, "hidden size = heads * head_dim")
          .in_range(1, 1 << 20),
      FieldSpec("heads", FieldType::kInt, int64_t{4}, "query heads").in_range(1, 4096),
      FieldSpec("kv_heads", FieldType::kInt, int64_t{1}, "key/value heads (GQA)").in_range(1, 4096),
  };
  k.prod_ops = {"lora_qkv"};
  k.id_part = [](const CaseSpec& s) {
    return "h" + std::to_string(s.get_int("hidden")) + ".q" + std::to_string(s.get_int("heads")) +
           "kv" + std::to_string(s.get_int("kv_heads"));
  };
  k.validate = [](const CaseSpec& s) { validate_heads(s, /*rope=*/false); };
  k.shape = [](const CaseSpec& s) {
    const int64_t hidden = s.get_int("hidden");
    const int64_t kv = hidden / s.get_int("heads") * s.get_int("kv_heads");
    return LoraOpShape{{{"q_proj", hidden, hidden, "hidden", "hidden"},
                        {"k_proj", hidden, kv, "hidden", "kv_heads"},
                        {"v_proj", hidden, kv, "hidden", "kv_heads"}},
                       hidden,
                       "qkv_proj",
                       {{"q_proj", "dq", hidden}, {"k_proj", "dk", kv}, {"v_proj", "dv", kv}},
                       {{"dropout.x", hidden}}};
  };
  k.prod = [](const impl::Ops& ops, const OpArgs& a) {
    const auto y = ops.lora_qkv(a.x, a.projection("q_proj"), a.projection("k_proj"),
                                a.projection("v_proj"), a.lora, a.dropout("dropout.x"));
    return Named<at::Tensor>{{"q_proj", y[0]}, {"k_proj", y[1]}, {"v_proj", y[2]}};
  };
  k.sample = [](CaseDraw& d) {
    const int64_t bits = field_draws::gptq(d);
    const int64_t step = bits == 3 ? 32 : 32 / bits;
    // head_dim a multiple of the step, so that k_proj's kv_heads * head_dim packs.
    const int64_t head_dim = d.chance(0.5) ? step * d.pick<int64_t>({1, 3, 5})
                                           : std::max(step, d.pick<int64_t>({16, 32, 64}));
    const int64_t heads = d.pick<int64_t>({2, 3, 4, 8});
    d.set("hidden", head_dim * heads);
    d.set("heads", heads);
    d.set("kv_heads", d.chance(0.5) ? heads : d.pick<int64_t>({1, 2}));
    field_draws::lora(d, true, true, 256);
  };
  return lora_op_kind(std::move(k));
}

}  // namespace gradscope

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/generated/variable_factories.h>

#include "error_text.h"
#include "gradscope/lora_ops.h"
#include "gradscope/quant_linear.h"
#include "harness/generate/gptq_layer_gen.h"

namespace gradscope {
namespace {

GptqWeight seeded_layer(int bits = 4) {
  const auto q = quantize_seeded_layer(
      3, "ql.", 128, 64, quantize_options(bits, 32, true, true, false, ZeroPointFormat::kGptqV1));
  return pack_gptq(q, bits, ZeroPointFormat::kGptqV1, at::kHalf);
}

TEST(QuantLinear, EveryStorageGivesTheSameOutputAsTheFusedOp) {
  const auto w = seeded_layer();
  const auto x = at::randn({2, 5, 128}, at::kFloat);
  QuantLinearOptions base;
  base.rank = 4;
  base.scaling = 2.0;
  QuantLinear reference(w, at::Tensor(), base);
  const auto expected = reference->forward(x);
  for (auto view : {at::kFloat, at::kHalf, at::kBFloat16}) {
    auto o = base;
    o.storage = PackedStorage::kFloatParameters;
    o.view_dtype = view;
    QuantLinear layer(w, at::Tensor(), o);
    {
      torch::NoGradGuard no_grad;
      layer->lora_A.copy_(reference->lora_A);
      layer->lora_B.copy_(reference->lora_B);
    }
    EXPECT_TRUE(at::equal(layer->forward(x), expected)) << view;
    // FSDP sees only floating parameters; the frozen ones need no gradient.
    EXPECT_TRUE(layer->buffers().empty());
    for (const auto& p : layer->named_parameters()) {
      EXPECT_TRUE(at::isFloatingType(p.value().scalar_type())) << p.key();
      EXPECT_EQ(p.value().requires_grad(), p.key() == "lora_A" || p.key() == "lora_B") << p.key();
    }
    EXPECT_TRUE(at::equal(layer->packed().qweight, w.qweight));
    EXPECT_TRUE(at::equal(layer->packed().g_idx, w.g_idx));
  }
}

TEST(QuantLinear, ACastOfTheFloatViewIsRefusedNamingTheTensor) {
  QuantLinearOptions o;
  o.storage = PackedStorage::kFloatParameters;
  o.view_dtype = at::kFloat;
  QuantLinear layer(seeded_layer(), at::Tensor(), o);
  layer->to(at::kBFloat16);  // a mixed-precision policy's param_dtype
  const auto err = testing::torch_error_of([&] {
    layer->forward(at::randn({3, 128}, at::kBFloat16));
  });
  EXPECT_NE(err.find("qweight is stored as BFloat16 but was registered as Float"),
            std::string::npos)
      << err;
}

TEST(QuantLinear, AWriteIntoTheStoredWordsIsCaughtByTheFingerprint) {
  QuantLinearOptions o;
  o.storage = PackedStorage::kFloatParameters;
  o.view_dtype = at::kHalf;
  QuantLinear layer(seeded_layer(3), at::Tensor(), o);
  layer->check_packed_intact();
  {
    torch::NoGradGuard no_grad;
    auto qzeros = layer->named_parameters()["qzeros"];
    qzeros.copy_(qzeros.to(at::kFloat).to(at::kHalf));  // a numeric round trip
    layer->named_parameters()["qweight"][0][1].add_(1);
  }
  const auto err = testing::torch_error_of([&] { layer->check_packed_intact(); });
  EXPECT_NE(err.find("QuantLinear: qweight no longer holds the packed words"), std::string::npos)
      << err;
}

TEST(QuantLinear, StateDictCopyIsBitExactForNaNAndSubnormalPatterns) {
  auto w = seeded_layer();
  w.qweight = w.qweight.clone();
  w.qweight[0][0] = static_cast<int32_t>(0x7FC00001);  // a NaN with payload as fp32
  w.qweight[0][1] = static_cast<int32_t>(0x7C01FC01);  // NaN in both fp16 halves
  w.qweight[0][2] = 1;                                 // a subnormal as fp32 and fp16
  for (auto view : {at::kFloat, at::kHalf, at::kBFloat16}) {
    QuantLinearOptions o;
    o.storage = PackedStorage::kFloatParameters;
    o.view_dtype = view;
    QuantLinear src(w, at::Tensor(), o), dst(seeded_layer(), at::Tensor(), o);
    {
      torch::NoGradGuard no_grad;
      auto to = dst->named_parameters();
      for (const auto& p : src->named_parameters()) to[p.key()].copy_(p.value());
    }
    EXPECT_TRUE(at::equal(dst->packed().qweight, w.qweight)) << view;
  }
}

}  // namespace
}  // namespace gradscope

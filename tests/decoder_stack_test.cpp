// The decoder stack that kinds layer and training build (harness/kinds/decoder_stack.h).
#include <gtest/gtest.h>

#include "harness/catalog/case_file.h"
#include "harness/kinds/decoder_stack.h"
#include "test_files.h"

namespace gradscope {
namespace {

// prod and the baseline each get their own frozen tensors of a layer (norm weights, packed
// words), on the CPU too: a prod that writes into them must not move the baseline.
TEST(DecoderStack, ProdAndBaseHoldTheirOwnFrozenTensors) {
  testing::TempDir dir;
  const auto specs = load_case_file(dir.write(
      "layer.toml", "kind = \"layer\"\nhidden = 64\nintermediate = 96\nheads = 4\nkv_heads = 2\n"));
  ASSERT_EQ(specs.size(), 1u);
  const lora_testbed::Config c(specs[0]);
  const decoder_stack::Dims dims(specs[0]);
  const auto stack = decoder_stack::make_stack(c, dims);
  const auto prod = decoder_stack::device_layer(c, dims, stack[0], lora_testbed::Role::kProd, 0);
  const auto base = decoder_stack::device_layer(c, dims, stack[0], lora_testbed::Role::kBase, 0);
  EXPECT_NE(prod.input_norm.data_ptr(), base.input_norm.data_ptr());
  EXPECT_NE(prod.post_attention_norm.data_ptr(), base.post_attention_norm.data_ptr());
  EXPECT_TRUE(prod.input_norm.equal(base.input_norm));
  const auto prod_projections = decoder_stack::named_projections(prod);
  const auto base_projections = decoder_stack::named_projections(base);
  ASSERT_EQ(prod_projections.size(), base_projections.size());
  for (size_t i = 0; i < prod_projections.size(); ++i) {
    EXPECT_NE(prod_projections[i].projection->base.qweight.data_ptr(),
              base_projections[i].projection->base.qweight.data_ptr())
        << prod_projections[i].name;
  }
}

}  // namespace
}  // namespace gradscope

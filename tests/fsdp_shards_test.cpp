// ShardedParameters over real c10d Gloo groups (ranks as threads): shard sizes, released
// storage, bit-exact gathers of float views with NaN and subnormal patterns, and the
// reduce-scatter sum, for both of FSDP's strategies.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <stdexcept>

#include "gradscope/fsdp_shards.h"
#include "harness/checkpoint/checkpoint_shards.h"
#include "harness/checkpoint/checkpoint_writer.h"
#include "harness/distributed/thread_ranks.h"
#include "harness/verdict/compare.h"
#include "test_files.h"

namespace gradscope {
namespace {

void on_ranks(int world, const RankBody& body) {
  const auto errors = run_thread_ranks(world, c10::DeviceType::CPU, std::chrono::seconds(60), body);
  for (int r = 0; r < world; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
}

// Words as a bf16 view [3, 10] (odd sizes: padding on every strategy), NaN payloads and
// subnormals among them, and an fp32 adapter [5, 3].
std::vector<at::Tensor> parameters() {
  auto words = at::arange(15, at::kInt).mul_(0x01010101);
  words[0] = static_cast<int32_t>(0x7fc00001);  // fp32 NaN with payload; bf16 halves NaN
  words[1] = 0x00010001;                        // subnormal halves
  words[2] = static_cast<int32_t>(0xff817c01);
  return {words.view(at::kBFloat16).view({3, 10}), at::arange(15, at::kFloat).view({5, 3}) * 0.5};
}

class ShardedParametersTest : public ::testing::TestWithParam<ShardingStrategy> {};

TEST_P(ShardedParametersTest, ShardsReleaseGatherAndReduceScatter) {
  for (int world : {2, 3}) {
    on_ranks(world, [&](int rank, const c10::intrusive_ptr<c10d::Backend>& backend) {
      const auto original = parameters();
      std::vector<at::Tensor> params;
      for (const auto& p : original) params.push_back(p.clone());
      ShardedParameters sharded(params, GetParam(), backend);
      // Only this rank's part is kept: 1/world of each (padded) parameter or dtype group.
      for (const auto& p : params) EXPECT_EQ(p.numel(), 0);
      if (GetParam() == ShardingStrategy::kFlat) {
        ASSERT_EQ(sharded.shards().size(), 2u);  // one flat buffer per dtype
        EXPECT_EQ(sharded.shards()[0].numel(), (30 + world - 1) / world);
        EXPECT_EQ(sharded.shards()[1].numel(), (15 + world - 1) / world);
      } else {
        ASSERT_EQ(sharded.shards().size(), 2u);
        EXPECT_EQ(sharded.shards()[0].size(0), (3 + world - 1) / world);
        EXPECT_EQ(sharded.shards()[1].size(0), (5 + world - 1) / world);
      }
      sharded.gather();
      for (size_t i = 0; i < params.size(); ++i) {
        EXPECT_TRUE(at::equal(bit_pattern(params[i]), bit_pattern(original[i]))) << "param " << i;
      }
      // Rank r contributes (r + 1) * g: the sum is g * world (world + 1) / 2.
      std::vector<at::Tensor> grads;
      for (const auto& p : original) grads.push_back(at::ones_like(p, at::kFloat) * (rank + 1));
      const auto summed = sharded.gather_copy(sharded.reduce_scatter(grads));
      for (size_t i = 0; i < grads.size(); ++i) {
        EXPECT_TRUE(at::allclose(summed[i].to(at::kFloat),
                                 at::ones_like(grads[i]) * (world * (world + 1) / 2.0)))
            << "grad " << i;
      }
      sharded.release();
      for (const auto& p : params) EXPECT_EQ(p.numel(), 0);
    });
  }
}

// A checkpoint of small layers in `tmp`; down_proj has 11 qweight rows at 4 bits, uneven
// over 2 and 3 ranks.
ExportOptions small_layers(const testing::TempDir& tmp) {
  ExportOptions e;
  e.dir = tmp.path("ckpt");
  e.hidden = 128;
  e.intermediate = 352;
  e.heads = 4;
  e.kv_heads = 2;
  return e;
}

// Low-memory loading from a checkpoint: each rank reads only its share of qweight, and the
// gathered module is what load() reads, word for word, in every storage view.
TEST_P(ShardedParametersTest, CheckpointModulesLoadShardByShard) {
  const testing::TempDir tmp;
  auto e = small_layers(tmp);
  e.desc_act = true;
  e.layers = 2;
  e.shards = 2;  // two files, opened on first use by whichever rank thread comes first
  export_checkpoint(e);
  const GptqCheckpoint ckpt(e.dir);
  for (const auto view : {at::kInt, at::kFloat, at::kBFloat16}) {
    for (int world : {2, 3}) {
      on_ranks(world, [&](int rank, const c10::intrusive_ptr<c10d::Backend>& backend) {
        for (const auto& module : ckpt.modules()) {
          const std::string where = module + " " + std::string(c10::toString(view)) + " rank " +
                                    std::to_string(rank) + "/" + std::to_string(world);
          auto sharded = shard_checkpoint_module(ckpt, module, view, GetParam(), backend, at::kCPU);
          const auto want = ckpt.load(module).weight;
          int64_t held = 0;
          for (const auto& s : sharded.shards->shards()) held += s.nbytes();
          for (const auto& p : sharded.parameters) EXPECT_EQ(p.numel(), 0) << where;
          // This rank's share of the words, not the layer: 1/world of each tensor plus at
          // most one row of padding.
          int64_t bound = 0;
          for (const auto& t : {want.qweight, want.qzeros, want.scales, want.g_idx}) {
            bound += (static_cast<int64_t>(t.nbytes()) + world - 1) / world +
                     static_cast<int64_t>(t.nbytes()) / t.size(0);
          }
          EXPECT_LE(held, bound) << where;
          sharded.shards->gather();
          const auto got = sharded.packed();
          EXPECT_TRUE(at::equal(got.qweight, want.qweight)) << where;
          EXPECT_TRUE(at::equal(got.qzeros, want.qzeros)) << where;
          EXPECT_TRUE(at::equal(got.scales, want.scales)) << where;
          EXPECT_TRUE(at::equal(got.g_idx, want.g_idx)) << where;
          EXPECT_EQ(got.bits, want.bits);
          EXPECT_EQ(got.format, want.format);
        }
      });
    }
  }
}

// A module with a bias (Qwen's q/k/v have one) keeps it: sharded and gathered like the rest.
TEST_P(ShardedParametersTest, CheckpointBiasIsShardedToo) {
  const testing::TempDir tmp;
  const auto e = small_layers(tmp);
  export_checkpoint(e);
  // Rewrite the single file with a bias for q_proj (config files stay as exported).
  const std::string module = module_name(0, "q_proj");
  const std::string path = e.dir + "/model.safetensors";
  const auto bias = at::linspace(-1, 1, 128, at::kHalf);
  {
    std::vector<safetensors::OutputTensor> tensors;
    const safetensors::File file(path);
    for (const auto& entry : file.header().tensors) {
      tensors.push_back(to_safetensors(entry.name, from_safetensors(file, entry)));
    }
    tensors.push_back(to_safetensors(module + ".bias", bias));
    safetensors::write_file(path, tensors, file.header().metadata);
  }
  const GptqCheckpoint ckpt(e.dir);
  on_ranks(2, [&](int, const c10::intrusive_ptr<c10d::Backend>& backend) {
    auto sharded =
        shard_checkpoint_module(ckpt, module, at::kBFloat16, GetParam(), backend, at::kCPU);
    ASSERT_EQ(sharded.parameters.size(), 5u);
    sharded.shards->gather();
    EXPECT_TRUE(at::equal(sharded.bias(), bias));
    EXPECT_TRUE(at::equal(sharded.packed().qweight, ckpt.load(module).weight.qweight));
  });
}

// A failing rank still arrives at the ranks' closing barrier: the others leave without waiting
// out the timeout (they would report it), and each rank reports only its own error.
TEST(ThreadRanks, AFailingRankDoesNotHoldTheOthers) {
  const auto errors =
      run_thread_ranks(3, c10::DeviceType::CPU, std::chrono::seconds(20),
                       [](int rank, const c10::intrusive_ptr<c10d::Backend>& backend) {
                         if (rank == 1) throw std::runtime_error("rank 1 failed on purpose");
                         EXPECT_EQ(backend->getRank(), rank);
                       });
  ASSERT_EQ(errors.size(), 3u);
  EXPECT_EQ(errors[0], "");
  EXPECT_EQ(errors[1], "rank 1 failed on purpose");
  EXPECT_EQ(errors[2], "");
}

// A rank that fails before a collective the others are in: every rank returns, the failed
// one with its own error and the others with theirs (aborted, or timed out where the backend
// cannot abort), not a hang.
TEST(ThreadRanks, AFailingRankDoesNotHangTheOthersInACollective) {
  const auto errors =
      run_thread_ranks(3, c10::DeviceType::CPU, std::chrono::seconds(3),
                       [](int rank, const c10::intrusive_ptr<c10d::Backend>& backend) {
                         if (rank == 1) throw std::runtime_error("rank 1 failed on purpose");
                         std::vector<at::Tensor> t = {at::ones({4})};
                         backend->allreduce(t)->wait();
                       });
  ASSERT_EQ(errors.size(), 3u);
  EXPECT_EQ(errors[1], "rank 1 failed on purpose");
  EXPECT_NE(errors[0], "");
  EXPECT_NE(errors[2], "");
}

INSTANTIATE_TEST_SUITE_P(Strategies, ShardedParametersTest,
                         ::testing::Values(ShardingStrategy::kFlat,
                                           ShardingStrategy::kPerParameter));

}  // namespace
}  // namespace gradscope

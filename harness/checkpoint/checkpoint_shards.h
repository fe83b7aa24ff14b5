// One GPTQ module of a checkpoint loaded for FSDP-style sharding without ever holding its
// whole qweight: qzeros, scales and g_idx (a few percent of the bytes) are read and checked
// whole as GptqCheckpoint::load checks them; qweight's words are copied out of the mapped file
// only where this rank's shards lie, a piece at a time, straight to the device.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "gradscope/fsdp_shards.h"
#include "harness/checkpoint/checkpoint_reader.h"

namespace gradscope {

struct ShardedModule {
  // qweight, qzeros, scales, g_idx (and bias where the checkpoint has one): packed words as
  // a bit-exact `view` (int32 or a float dtype, as QuantLinear stores them), scales and bias
  // in their own dtype. Empty until gather().
  std::vector<at::Tensor> parameters;
  std::unique_ptr<ShardedParameters> shards;
  int bits = 4;
  ZeroPointFormat format = ZeroPointFormat::kGptqV1;

  // The gathered parameters as the packed layer (int32 views, no copy); after gather().
  GptqWeight packed() const;
  at::Tensor bias() const;  // undefined when the checkpoint has none
};

ShardedModule shard_checkpoint_module(const GptqCheckpoint& checkpoint, const std::string& module,
                                      at::ScalarType view, ShardingStrategy strategy,
                                      c10::intrusive_ptr<c10d::Backend> backend, at::Device device);

}  // namespace gradscope

// An FSDP-compatible GPTQ linear layer with an optional LoRA adapter. The packed words
// live either in int32 buffers or, so that FSDP can flatten and shard them, in parameters
// of a floating dtype holding a bit-exact view of the words (requires_grad = false);
// scales and g_idx follow the same storage. Every kernel call views back to int32 first.
// A numeric cast of a float view destroys the words silently, so the layer keeps a
// fingerprint of them and refuses to run on storage that was cast.
#pragma once

#include <torch/nn/module.h>

#include "gradscope/gptq_format.h"
#include "gradscope/lora_ops.h"

namespace gradscope {

enum class PackedStorage {
  kInt32Buffers,     // qweight, qzeros, g_idx int32 buffers; scales a buffer
  kFloatParameters,  // every tensor a frozen parameter; integer words as a float view
};

struct QuantLinearOptions {
  PackedStorage storage = PackedStorage::kInt32Buffers;
  at::ScalarType view_dtype = at::kBFloat16;  // the model's parameter dtype, for float views
  int64_t rank = 0;                           // 0: no adapter
  double scaling = 1.0;
  at::ScalarType adapter_dtype = at::kFloat;
};

class QuantLinearImpl : public torch::nn::Module {
 public:
  QuantLinearImpl(const GptqWeight& weight, const at::Tensor& bias, QuantLinearOptions options);

  // y = x W^T + b (+ s (x A^T) B^T) through the fused op; checks the storage dtypes first.
  at::Tensor forward(const at::Tensor& x);

  // The packed tensors viewed back to their integer form (no copy).
  GptqWeight packed() const;
  // Throws c10::Error naming the tensor when a stored word no longer matches the
  // fingerprint taken at construction (one reduction and a host sync per tensor).
  void check_packed_intact() const;

  const QuantLinearOptions& options() const { return options_; }
  at::Tensor lora_A, lora_B;  // defined when rank > 0

 private:
  at::Tensor stored(const char* name) const;
  void check_storage_dtypes() const;

  QuantLinearOptions options_;
  int bits_;
  ZeroPointFormat format_;
  at::ScalarType scales_dtype_;
  at::Tensor qweight_, qzeros_, scales_, g_idx_, bias_;
  std::vector<std::pair<std::string, std::pair<int64_t, int64_t>>> fingerprints_;
};
TORCH_MODULE(QuantLinear);

// Two sums over the words as int64: any change of a word's bits changes them except by
// rare coincidence, and a numeric cast changes nearly every word.
std::pair<int64_t, int64_t> packed_fingerprint(const at::Tensor& words);

}  // namespace gradscope

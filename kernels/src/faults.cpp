#include "gradscope/faults.h"

#include "dequant_fault_modes.h"

namespace gradscope {

static_assert(static_cast<int>(Fault::kUnpackShiftOffByOne) == dequant_faults::kShiftOffByOne);
static_assert(static_cast<int>(Fault::kV1ZeroOffsetMissing) == dequant_faults::kV1OffsetMissing);
static_assert(static_cast<int>(Fault::kV1ZeroOffsetTwice) == dequant_faults::kV1OffsetTwice);
static_assert(static_cast<int>(Fault::kGIdxIgnored) == dequant_faults::kGIdxIgnored);
static_assert(static_cast<int>(Fault::kGroupBoundaryOffByOne) ==
              dequant_faults::kGroupBoundaryOffByOne);
static_assert(static_cast<int>(Fault::kStraddleHighBitsDropped) ==
              dequant_faults::kStraddleHighBitsDropped);
static_assert(static_cast<int>(Fault::kScalesWrongColumn) == dequant_faults::kScalesWrongColumn);

const std::vector<FaultInfo>& fault_catalogue() {
  static const std::vector<FaultInfo> catalogue = {
      {Fault::kUnpackShiftOffByOne, "unpack-shift-off-by-one", "dequant (CPU loop, CUDA kernel)",
       "every weight: codes read one bit too high", "/gptq/weight"},
      {Fault::kV1ZeroOffsetMissing, "v1-zero-offset-missing", "dequant zero points",
       "v1 checkpoints: every weight off by one scale step", "/gptq/weight"},
      {Fault::kV1ZeroOffsetTwice, "v1-zero-offset-twice", "dequant zero points",
       "v1 checkpoints: every weight off by one scale step the other way", "/gptq/weight"},
      {Fault::kGIdxIgnored, "g-idx-ignored", "dequant scale/zero gather",
       "act-order layers: rows take a contiguous group's scale and zero", "/gptq/weight"},
      {Fault::kGroupBoundaryOffByOne, "group-boundary-off-by-one", "dequant scale/zero gather",
       "the last row of each group takes the next group's scale and zero", "/gptq/weight"},
      {Fault::kStraddleHighBitsDropped, "3bit-straddle-high-bits-dropped", "dequant unpacking",
       "3-bit codes 10 and 21 of every 32 rows", "/gptq/weight"},
      {Fault::kScalesWrongColumn, "scales-wrong-column", "dequant scale gather",
       "every weight scaled by its neighbour column's scale", "/gptq/weight"},
      {Fault::kFloatViewCast, "fsdp-float-view-cast", "as_packed_words (FSDP storage)",
       "packed words held as a float view: a numeric cast destroys them", "/gptq/weight"},
      {Fault::kDropoutRescaleMissing, "dropout-rescale-missing", "lora backward, dX adapter term",
       "input.grad whenever dropout > 0", "input.grad"},
      {Fault::kLoraScaleMissingInDA, "lora-scale-missing-in-dA", "lora backward, dA",
       "lora_A.grad whenever the scaling is not 1", "lora_A.grad"},
      {Fault::kDAFromUndroppedX, "dA-from-undropped-x", "lora backward, dA",
       "lora_A.grad whenever dropout > 0", "lora_A.grad"},
      {Fault::kDxMissingAdapterTerm, "dx-missing-adapter-term", "lora backward, dX",
       "input.grad of every projection", "input.grad"},
      {Fault::kSwigluDerivativeMissingTerm, "swiglu-derivative-missing-term",
       "SwiGLU backward (CPU loop, CUDA kernel)", "gate_proj gradients and the MLP's input.grad",
       "gate_proj/lora_A.grad"},
      {Fault::kHalfPrecisionAccumulation, "half-precision-accumulation", "lora backward, dA",
       "lora_A.grad in fp16/bf16 cases (sums rounded to the dtype at every token)", "lora_A.grad"},
      {Fault::kZerosRewrittenInBackward, "zeros-rewritten-in-backward",
       "lora backward, after dX (a load-time conversion run on every call)",
       "the frozen qzeros, so every forward after the first backward", "gptq/qzeros"},
      {Fault::kLoraBOverwrittenByGrad, "lora-B-overwritten-by-grad",
       "lora backward, dB written through lora_B's storage",
       "lora_B itself (its gradient stays right): the next step starts from dB", "lora_B"},
      {Fault::kRopeTableInActivationDtype, "rope-table-in-activation-dtype",
       "decoder layer, RoPE tables",
       "positions and angles rounded to x's dtype: wrong rotations at long positions (bf16 holds "
       "integers only up to 256)",
       "hidden/output"},
      {Fault::kRmsNormVarianceInActivationDtype, "rmsnorm-variance-in-activation-dtype",
       "decoder layer, RMSNorm statistics",
       "mean(x^2) in x's dtype: fp16 overflows for |x| >= 256 and zeroes the token",
       "hidden/output"},
      {Fault::kSwigluSigmoidOverflow, "swiglu-sigmoid-overflow",
       "SwiGLU forward and backward (CPU loop, CUDA kernel)",
       "sigmoid as exp(e) / (1 + exp(e)): NaN once exp(e) overflows (gate values above 88)",
       "down_proj/output"},
      {Fault::kAdapterPathInActivationDtype, "adapter-path-in-activation-dtype",
       "lora forward and backward, adapter path",
       "fp32 adapters' products rounded to fp16/bf16: adapter gradients overflow beyond the "
       "activation range",
       "lora_A.grad"},
      {Fault::kLoraScalingIgnoresRslora, "lora-scaling-ignores-rslora", "lora_scaling()",
       "rsLoRA cases: scaling alpha / r instead of alpha / sqrt(r)", "/output"},
      {Fault::kDequantOutputFloat32, "dequant-output-float32", "dequantize_gptq, output dtype",
       "fp16/bf16 dequant cases: fp32 weights returned (closer to the reference, wrong dtype)",
       "/gptq/weight"},
      {Fault::kLoraOutputFloat32, "lora-output-float32", "fused LoRA ops, output dtype",
       "fp16/bf16 cases: outputs handed back in fp32 (closer to the reference, wrong dtype)",
       "/output"},
  };
  return catalogue;
}

const FaultInfo* find_fault(const std::string& name) {
  for (const auto& f : fault_catalogue()) {
    if (name == f.name) return &f;
  }
  return nullptr;
}

}  // namespace gradscope

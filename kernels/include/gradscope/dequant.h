// Dequantization of a GPTQ layer to a dense weight, on the CPU or a CUDA device
// (the device of qweight decides).
#pragma once

#include <ATen/core/Tensor.h>

#include "gradscope/gptq_format.h"

namespace gradscope {

enum class DequantLayout {
  kInOut,  // W^T [in_features, out_features], the GPTQ-native layout
  kOutIn,  // W [out_features, in_features], nn.Linear's layout
};

// W^T[k, n] = scales[g_idx[k], n] * (code(k, n) - zero(g_idx[k], n)), computed in
// fp32 and rounded once to out_dtype (fp32, fp16 or bf16).
at::Tensor dequantize_gptq(const GptqWeight& weight, at::ScalarType out_dtype,
                           DequantLayout layout = DequantLayout::kInOut);

// True when this build carries the CUDA kernels.
bool built_with_cuda();

}  // namespace gradscope

// Internal: the per-device dequant implementations behind dequantize_gptq.
#pragma once

#include <ATen/core/Tensor.h>

#include "gradscope/dequant.h"

namespace gradscope::detail {

// Validated, contiguous int32 views of one layer, on one device.
struct DequantInputs {
  at::Tensor qweight;  // int32 [K * bits / 32, N]
  at::Tensor qzeros;   // int32 [G, N * bits / 32]
  at::Tensor scales;   // fp16 / bf16 [G, N]
  at::Tensor g_idx;    // int32 [K]
  int bits;
  int zero_offset;  // 1 for v1 ("gptq"), 0 for v2
  int64_t in_features;
  int64_t out_features;
  int fault;  // dequant_faults::Mode; kNone unless a fault is injected
};

at::Tensor dequantize_gptq_cpu(const DequantInputs& in, at::ScalarType out_dtype,
                               DequantLayout layout);
at::Tensor dequantize_gptq_cuda(const DequantInputs& in, at::ScalarType out_dtype,
                                DequantLayout layout);

}  // namespace gradscope::detail

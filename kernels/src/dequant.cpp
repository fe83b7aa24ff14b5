#include "gradscope/dequant.h"

#include <ATen/ATen.h>

#include "dequant_impl.h"
#include "gradscope/faults.h"

namespace gradscope {

at::Tensor dequantize_gptq(const GptqWeight& weight, at::ScalarType out_dtype,
                           DequantLayout layout) {
  validate_gptq_weight(weight);
  TORCH_CHECK(out_dtype == at::kFloat || out_dtype == at::kHalf || out_dtype == at::kBFloat16,
              "gptq dequant: output dtype must be float32, float16 or bfloat16, got ", out_dtype);
  detail::DequantInputs in{
      as_packed_words(weight.qweight, "qweight").contiguous(),
      as_packed_words(weight.qzeros, "qzeros").contiguous(),
      weight.scales.contiguous(),
      weight.g_idx.contiguous(),
      weight.bits,
      weight.format == ZeroPointFormat::kGptqV1 ? 1 : 0,
      weight.in_features(),
      weight.out_features(),
      active_fault() < Fault::kFirstLoraFault && active_fault() != Fault::kFloatViewCast
          ? static_cast<int>(active_fault())
          : 0};
  // The fault decodes into fp32 and hands that back whatever dtype was asked for.
  const auto dtype = fault_active(Fault::kDequantOutputFloat32) ? at::kFloat : out_dtype;
  if (in.qweight.is_cuda()) return detail::dequantize_gptq_cuda(in, dtype, layout);
  TORCH_CHECK(in.qweight.is_cpu(), "gptq dequant: unsupported device ", in.qweight.device());
  return detail::dequantize_gptq_cpu(in, dtype, layout);
}

}  // namespace gradscope

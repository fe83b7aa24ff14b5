// CPU dequantization: rows in parallel, fp32 arithmetic, one rounding to the output dtype.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include "dequant_fault_modes.h"
#include "dequant_impl.h"
#include "packed_bits.h"

namespace gradscope::detail {
namespace {

template <typename Out, typename Scale>
void dequant_rows(const DequantInputs& in, const at::Tensor& zero_fields, at::Tensor& out,
                  DequantLayout layout) {
  const int64_t K = in.in_features, N = in.out_features, words = in.qweight.size(0);
  const int64_t G = in.scales.size(0);
  const int bits = in.bits, fault = in.fault;
  const auto* qweight = reinterpret_cast<const uint32_t*>(in.qweight.data_ptr<int32_t>());
  const int32_t* field = zero_fields.data_ptr<int32_t>();
  const int zero_offset = dequant_faults::zero_offset(in.zero_offset == 1, fault);
  const Scale* scale = in.scales.data_ptr<Scale>();
  const int32_t* g_idx = in.g_idx.data_ptr<int32_t>();
  Out* dst = out.data_ptr<Out>();
  at::parallel_for(0, K, 16, [&](int64_t begin, int64_t end) {
    for (int64_t k = begin; k < end; ++k) {
      const int64_t bit = dequant_faults::code_bit(k * bits, fault);
      const packed_bits::FieldPosition pos{bit >> 5, static_cast<int>(bit & 31)};
      const bool two = packed_bits::straddles(pos.shift, bits) && pos.word + 1 < words &&
                       dequant_faults::keep_high_word(fault);
      const int64_t g = dequant_faults::group(k, K, G, g_idx, fault);
      for (int64_t n = 0; n < N; ++n) {
        const uint32_t high = two ? qweight[(pos.word + 1) * N + n] : 0u;
        const auto code = static_cast<int32_t>(
            packed_bits::read_field(qweight[pos.word * N + n], high, pos.shift, bits));
        const int32_t zero = field[g * N + n] + zero_offset;
        const float value =
            static_cast<float>(scale[g * N + dequant_faults::scale_column(n, N, fault)]) *
            static_cast<float>(code - zero);
        dst[layout == DequantLayout::kInOut ? k * N + n : n * K + k] = static_cast<Out>(value);
      }
    }
  });
}

template <typename Out>
void dispatch_scale(const DequantInputs& in, const at::Tensor& zeros, at::Tensor& out,
                    DequantLayout layout) {
  if (in.scales.scalar_type() == at::kHalf) {
    dequant_rows<Out, at::Half>(in, zeros, out, layout);
  } else {
    dequant_rows<Out, at::BFloat16>(in, zeros, out, layout);
  }
}

}  // namespace

at::Tensor dequantize_gptq_cpu(const DequantInputs& in, at::ScalarType out_dtype,
                               DequantLayout layout) {
  const int64_t K = in.in_features, N = in.out_features;
  auto out = layout == DequantLayout::kInOut ? at::empty({K, N}, at::dtype(out_dtype))
                                             : at::empty({N, K}, at::dtype(out_dtype));
  // Unpack every stored zero field once ([G, N] is small next to [K, N]); the v1 offset
  // is added per element, where the fault modes apply it.
  const auto zeros = unpack_columns(in.qzeros, in.bits, N).contiguous();
  switch (out_dtype) {
    case at::kFloat:
      dispatch_scale<float>(in, zeros, out, layout);
      break;
    case at::kHalf:
      dispatch_scale<at::Half>(in, zeros, out, layout);
      break;
    default:
      dispatch_scale<at::BFloat16>(in, zeros, out, layout);
      break;
  }
  return out;
}

}  // namespace gradscope::detail

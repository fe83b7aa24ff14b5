// ATen glue for the CUDA dequant kernel: allocation, stream, error mapping.
#include <ATen/ATen.h>

#include "dequant_impl.h"

#ifdef GRADSCOPE_WITH_CUDA
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "cuda_glue.h"
#include "dequant_cuda_launch.h"
#endif

namespace gradscope {

bool built_with_cuda() {
#ifdef GRADSCOPE_WITH_CUDA
  return true;
#else
  return false;
#endif
}

namespace detail {

#ifdef GRADSCOPE_WITH_CUDA
at::Tensor dequantize_gptq_cuda(const DequantInputs& in, at::ScalarType out_dtype,
                                DequantLayout layout) {
  const c10::cuda::CUDAGuard guard(in.qweight.device());
  const int64_t K = in.in_features, N = in.out_features;
  // The kernel indexes a group's row of scales with 32-bit products.
  TORCH_CHECK(in.scales.size(0) * N < (int64_t{1} << 31), "gptq dequant on CUDA: scales [",
              in.scales.size(0), ", ", N,
              "] has 2^31 elements or more, past the kernel's indexing");
  const auto options = in.qweight.options().dtype(out_dtype);
  auto out =
      layout == DequantLayout::kInOut ? at::empty({K, N}, options) : at::empty({N, K}, options);
  // The kernel reads four columns' words and eight columns' scales as 16-byte vectors: a
  // view that does not start on such a boundary (a sliced shard, a view into a flat FSDP
  // buffer) is copied to a fresh, aligned allocation first.
  const auto aligned = [](const at::Tensor& t, uintptr_t bytes) {
    return reinterpret_cast<uintptr_t>(t.data_ptr()) % bytes == 0 ? t : t.clone();
  };
  const auto qweight = aligned(in.qweight, 16);
  const auto scales = aligned(in.scales, 16);
  cuda::DequantLaunch args{reinterpret_cast<const uint32_t*>(qweight.data_ptr<int32_t>()),
                           reinterpret_cast<const uint32_t*>(in.qzeros.data_ptr<int32_t>()),
                           scales.data_ptr(),
                           in.g_idx.data_ptr<int32_t>(),
                           out.data_ptr(),
                           K,
                           N,
                           in.bits,
                           in.zero_offset,
                           element_type(scales.scalar_type()),
                           element_type(out_dtype),
                           layout == DequantLayout::kOutIn,
                           in.scales.size(0),
                           in.fault};
  const cudaError_t err = cuda::launch_dequant_gptq(args, c10::cuda::getCurrentCUDAStream());
  TORCH_CHECK(err == cudaSuccess, "gptq dequant: CUDA launch failed for [", K, ", ", N, "] at ",
              in.bits, " bits: ", cudaGetErrorString(err));
  return out;
}
#else
at::Tensor dequantize_gptq_cuda(const DequantInputs&, at::ScalarType, DequantLayout) {
  TORCH_CHECK(false,
              "gptq dequant: qweight is on a CUDA device but gradscope was built without "
              "CUDA (GRADSCOPE_WITH_CUDA=OFF)");
}
#endif

}  // namespace detail
}  // namespace gradscope

// SwiGLU: validation, the CPU implementation and the CUDA glue.
#include "gradscope/swiglu.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include "gradscope/faults.h"
#include "swiglu_math.h"

#ifdef GRADSCOPE_WITH_CUDA
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "cuda_glue.h"
#include "swiglu_cuda_launch.h"
#endif

namespace gradscope {
namespace {

void check_same(const at::Tensor& a, const char* a_name, const at::Tensor& b, const char* b_name) {
  TORCH_CHECK(a.defined() && b.defined(), "swiglu: ", a_name, " and ", b_name, " must be defined");
  TORCH_CHECK(a.sizes() == b.sizes(), "swiglu: ", b_name, " has shape ", b.sizes(), " but ", a_name,
              " has ", a.sizes());
  TORCH_CHECK(a.scalar_type() == b.scalar_type(), "swiglu: ", b_name, " is ", b.scalar_type(),
              " but ", a_name, " is ", a.scalar_type());
  TORCH_CHECK(a.device() == b.device(), "swiglu: ", b_name, " is on ", b.device(), " but ", a_name,
              " is on ", a.device());
}

void check_dtype(const at::Tensor& e) {
  const auto t = e.scalar_type();
  TORCH_CHECK(t == at::kFloat || t == at::kHalf || t == at::kBFloat16,
              "swiglu: activations must be float32, float16 or bfloat16, got ", t);
}

// The active SwiGLU fault as both implementations take it.
int fault_mode() {
  if (fault_active(Fault::kSwigluDerivativeMissingTerm)) {
    return swiglu_math::kDerivativeMissingTerm;
  }
  if (fault_active(Fault::kSwigluSigmoidOverflow)) return swiglu_math::kSigmoidOverflow;
  return swiglu_math::kCorrect;
}

template <typename T>
void forward_cpu(const T* e, const T* g, T* h, int64_t n, int mode) {
  at::parallel_for(0, n, 4096, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const float ev = static_cast<float>(e[i]);
      const float silu = static_cast<float>(static_cast<T>(ev * swiglu_math::sigmoid(ev, mode)));
      h[i] = static_cast<T>(silu * static_cast<float>(g[i]));
    }
  });
}

template <typename T>
void backward_cpu(const T* dh, const T* e, const T* g, T* de, T* dg, int64_t n, int mode) {
  at::parallel_for(0, n, 4096, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const auto grad = swiglu_math::backward(static_cast<float>(dh[i]), static_cast<float>(e[i]),
                                              static_cast<float>(g[i]), mode);
      de[i] = static_cast<T>(grad.de);
      dg[i] = static_cast<T>(grad.dg);
    }
  });
}

}  // namespace

at::Tensor swiglu_forward(const at::Tensor& e_in, const at::Tensor& g_in) {
  check_same(e_in, "e (gate output)", g_in, "g (up output)");
  check_dtype(e_in);
  const auto e = e_in.contiguous(), g = g_in.contiguous();
  auto h = at::empty_like(e);
  const int mode = fault_mode();
  if (e.is_cuda()) {
#ifdef GRADSCOPE_WITH_CUDA
    const c10::cuda::CUDAGuard guard(e.device());
    const auto err = cuda::launch_swiglu_forward(e.data_ptr(), g.data_ptr(), h.data_ptr(),
                                                 e.numel(), detail::element_type(e.scalar_type()),
                                                 mode, c10::cuda::getCurrentCUDAStream());
    TORCH_CHECK(err == cudaSuccess,
                "swiglu forward: CUDA launch failed: ", cudaGetErrorString(err));
    return h;
#else
    TORCH_CHECK(false, "swiglu: CUDA tensors but gradscope was built without CUDA");
#endif
  }
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, e.scalar_type(), "swiglu_forward", [&] {
    forward_cpu<scalar_t>(e.data_ptr<scalar_t>(), g.data_ptr<scalar_t>(), h.data_ptr<scalar_t>(),
                          e.numel(), mode);
  });
  return h;
}

std::pair<at::Tensor, at::Tensor> swiglu_backward(const at::Tensor& dh_in, const at::Tensor& e_in,
                                                  const at::Tensor& g_in) {
  check_same(e_in, "e (gate output)", g_in, "g (up output)");
  check_same(e_in, "e (gate output)", dh_in, "dh (gradient of h)");
  check_dtype(e_in);
  const auto dh = dh_in.contiguous(), e = e_in.contiguous(), g = g_in.contiguous();
  auto de = at::empty_like(e), dg = at::empty_like(e);
  const int mode = fault_mode();
  if (e.is_cuda()) {
#ifdef GRADSCOPE_WITH_CUDA
    const c10::cuda::CUDAGuard guard(e.device());
    const auto err = cuda::launch_swiglu_backward(
        dh.data_ptr(), e.data_ptr(), g.data_ptr(), de.data_ptr(), dg.data_ptr(), e.numel(),
        detail::element_type(e.scalar_type()), mode, c10::cuda::getCurrentCUDAStream());
    TORCH_CHECK(err == cudaSuccess,
                "swiglu backward: CUDA launch failed: ", cudaGetErrorString(err));
    return {de, dg};
#else
    TORCH_CHECK(false, "swiglu: CUDA tensors but gradscope was built without CUDA");
#endif
  }
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf, at::kBFloat16, e.scalar_type(), "swiglu_backward", [&] {
        backward_cpu<scalar_t>(dh.data_ptr<scalar_t>(), e.data_ptr<scalar_t>(),
                               g.data_ptr<scalar_t>(), de.data_ptr<scalar_t>(),
                               dg.data_ptr<scalar_t>(), e.numel(), mode);
      });
  return {de, dg};
}

}  // namespace gradscope

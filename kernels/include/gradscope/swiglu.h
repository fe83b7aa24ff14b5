// SwiGLU activation of LLaMA MLPs, h = silu(e) * g, on the CPU or a CUDA device.
// sigmoid in fp32; silu is rounded to the activation dtype before the product,
// as the public fused kernels do.
#pragma once

#include <ATen/core/Tensor.h>

#include <utility>

namespace gradscope {

at::Tensor swiglu_forward(const at::Tensor& e, const at::Tensor& g);
// (de, dg) = (dh * g * sigmoid(e) * (1 + e * (1 - sigmoid(e))), dh * silu(e)), fp32
// arithmetic, rounded once to the activation dtype.
std::pair<at::Tensor, at::Tensor> swiglu_backward(const at::Tensor& dh, const at::Tensor& e,
                                                  const at::Tensor& g);

}  // namespace gradscope

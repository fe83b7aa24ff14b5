// The production ops as PyTorch operators in namespace `gradscope`, so a Python program can
// torch.ops.load_library("libgradscope_ops.so") and call them (and FSDP can wrap modules
// that do). Registered under CompositeImplicitAutograd: each operator is the C++ autograd
// function itself, so gradients reach x and every lora_A / lora_B as in C++, on whatever
// device the tensors live. A projection travels as a tensor list
// [qweight, qzeros, scales, g_idx, lora_A, lora_B] with an optional bias appended; packed
// words and g_idx may be int32 or a bit-exact float view (FSDP storage).
#include <torch/library.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "gradscope/dequant.h"
#include "gradscope/lora_ops.h"

namespace gradscope {
namespace {

ZeroPointFormat zero_format(const std::string& name) {
  try {
    return parse_zero_point_format(name);
  } catch (const std::invalid_argument& e) {
    TORCH_CHECK(false, "gradscope ops: zero_format: ", e.what());
  }
}

GptqWeight weight(const at::Tensor& qweight, const at::Tensor& qzeros, const at::Tensor& scales,
                  const at::Tensor& g_idx, int64_t bits, const std::string& format) {
  GptqWeight w;
  w.qweight = qweight;
  w.qzeros = qzeros;
  w.scales = scales;
  // g_idx may ride as a float view too (FSDP storage): its bytes are int32.
  w.g_idx = g_idx.is_floating_point() ? g_idx.contiguous().view(at::kInt) : g_idx;
  w.bits = static_cast<int>(bits);
  w.format = zero_format(format);
  return w;
}

LoraProjection projection(const char* op, const char* name, at::TensorList t, int64_t bits,
                          const std::string& format, double scaling) {
  TORCH_CHECK(t.size() == 6 || t.size() == 7, "gradscope.", op, ": ", name,
              " must be [qweight, qzeros, scales, g_idx, lora_A, lora_B] or those and bias, got ",
              t.size(), " tensors");
  LoraProjection p;
  p.base = weight(t[0], t[1], t[2], t[3], bits, format);
  p.lora_A = t[4];
  p.lora_B = t[5];
  if (t.size() == 7) p.bias = t[6];
  p.scaling = scaling;
  return p;
}

at::Tensor dequantize_op(const at::Tensor& qweight, const at::Tensor& qzeros,
                         const at::Tensor& scales, const at::Tensor& g_idx, int64_t bits,
                         const std::string& format, at::ScalarType dtype) {
  return dequantize_gptq(weight(qweight, qzeros, scales, g_idx, bits, format), dtype);
}

at::Tensor lora_w_op(const at::Tensor& x, at::TensorList proj, int64_t bits,
                     const std::string& format, double scaling) {
  return lora_w(x, projection("lora_w", "proj", proj, bits, format, scaling));
}

std::vector<at::Tensor> lora_qkv_op(const at::Tensor& x, at::TensorList q, at::TensorList k,
                                    at::TensorList v, int64_t bits, const std::string& format,
                                    double scaling) {
  return lora_qkv(x, projection("lora_qkv", "q", q, bits, format, scaling),
                  projection("lora_qkv", "k", k, bits, format, scaling),
                  projection("lora_qkv", "v", v, bits, format, scaling));
}

at::Tensor lora_mlp_op(const at::Tensor& x, at::TensorList gate, at::TensorList up,
                       at::TensorList down, int64_t bits, const std::string& format,
                       double scaling) {
  return lora_mlp(x, projection("lora_mlp", "gate", gate, bits, format, scaling),
                  projection("lora_mlp", "up", up, bits, format, scaling),
                  projection("lora_mlp", "down", down, bits, format, scaling));
}

}  // namespace
}  // namespace gradscope

TORCH_LIBRARY(gradscope, m) {
  m.def(
      "dequantize(Tensor qweight, Tensor qzeros, Tensor scales, Tensor g_idx, int bits, "
      "str zero_format, ScalarType dtype) -> Tensor");
  m.def("lora_w(Tensor x, Tensor[] proj, int bits, str zero_format, float scaling) -> Tensor");
  m.def(
      "lora_qkv(Tensor x, Tensor[] q, Tensor[] k, Tensor[] v, int bits, str zero_format, "
      "float scaling) -> Tensor[]");
  m.def(
      "lora_mlp(Tensor x, Tensor[] gate, Tensor[] up, Tensor[] down, int bits, "
      "str zero_format, float scaling) -> Tensor");
}

TORCH_LIBRARY_IMPL(gradscope, CompositeImplicitAutograd, m) {
  m.impl("dequantize", &gradscope::dequantize_op);
  m.impl("lora_w", &gradscope::lora_w_op);
  m.impl("lora_qkv", &gradscope::lora_qkv_op);
  m.impl("lora_mlp", &gradscope::lora_mlp_op);
}

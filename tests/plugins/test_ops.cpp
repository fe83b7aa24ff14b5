// Implementations under test for the tests of --impl / --ops-library, shaped like a third
// party's library: each namespace registers the contract's operators (docs/implementations.md)
// over its own code. Only `dequantize` borrows gradscope's kernel; the LoRA math is plain ATen
// with ATen's autograd, unfused.
//   plain_torch       correct lora_w and dequantize
//   unscaled          lora_w that leaves the adapter scaling out of the forward
//   declines_dropout  plain_torch's lora_w, but raises NotImplementedError when given dropout
//   old_schema        lora_w with the version-1 signature (scaling instead of alpha and rsLoRA)
//   no_lora_w         dequantize only
#include <ATen/ATen.h>
#include <torch/library.h>

#include <cmath>

#include "gradscope/dequant.h"
#include "gradscope/op_schemas.h"

namespace {

gradscope::GptqWeight weight(at::TensorList p, int64_t bits, const std::string& format) {
  gradscope::GptqWeight w;
  w.qweight = p[0];
  w.qzeros = p[1];
  w.scales = p[2];
  w.g_idx = p[3];
  w.bits = static_cast<int>(bits);
  w.format = gradscope::parse_zero_point_format(format);
  return w;
}

at::Tensor dequantize(const at::Tensor& qweight, const at::Tensor& qzeros, const at::Tensor& scales,
                      const at::Tensor& g_idx, int64_t bits, const std::string& format,
                      at::ScalarType dtype, const std::string& layout) {
  const auto w =
      gradscope::dequantize_gptq(weight({qweight, qzeros, scales, g_idx}, bits, format), dtype);
  return layout == "out_in" ? w.t().contiguous() : w;
}

at::Tensor linear(const at::Tensor& x, at::TensorList p, int64_t bits, const std::string& format,
                  double scaling, const std::optional<at::Tensor>& mask, double p_drop) {
  const auto w = gradscope::dequantize_gptq(weight(p, bits, format), x.scalar_type());
  auto y = at::matmul(x, w);
  if (p.size() == 7) y = y + p[6];
  auto xa = x.to(p[4].scalar_type());
  if (mask && mask->defined())
    xa = xa * mask->reshape(x.sizes()).to(xa.scalar_type()) / (1 - p_drop);
  const auto adapter = at::matmul(at::matmul(xa, p[4].t()), p[5].t()) * scaling;
  return y + adapter.to(y.scalar_type());
}

double scaling_of(double alpha, at::TensorList p, bool rslora) {
  const auto r = static_cast<double>(p[4].size(0));
  return rslora ? alpha / std::sqrt(r) : alpha / r;
}

at::Tensor lora_w(const at::Tensor& x, at::TensorList p, int64_t bits, const std::string& format,
                  double alpha, bool rslora, const std::optional<at::Tensor>& mask, double p_drop) {
  return linear(x, p, bits, format, scaling_of(alpha, p, rslora), mask, p_drop);
}

at::Tensor lora_w_unscaled(const at::Tensor& x, at::TensorList p, int64_t bits,
                           const std::string& format, double, bool,
                           const std::optional<at::Tensor>& mask, double p_drop) {
  return linear(x, p, bits, format, 1.0, mask, p_drop);
}

at::Tensor lora_w_declines_dropout(const at::Tensor& x, at::TensorList p, int64_t bits,
                                   const std::string& format, double alpha, bool rslora,
                                   const std::optional<at::Tensor>& mask, double p_drop) {
  TORCH_CHECK_NOT_IMPLEMENTED(!(mask && mask->defined()), "declines_dropout: no dropout");
  return lora_w(x, p, bits, format, alpha, rslora, mask, p_drop);
}

at::Tensor lora_w_v1(const at::Tensor& x, at::TensorList p, int64_t bits, const std::string& format,
                     double scaling) {
  return linear(x, p, bits, format, scaling, std::nullopt, 0);
}

const char* schema_of(const char* name) {
  for (const auto& op : gradscope::kOpSchemas) {
    if (std::string(op.name) == name) return op.schema;
  }
  return "";
}

}  // namespace

TORCH_LIBRARY(plain_torch, m) {
  m.def(schema_of("dequantize"));
  m.def(schema_of("lora_w"));
}
TORCH_LIBRARY_IMPL(plain_torch, CompositeImplicitAutograd, m) {
  m.impl("dequantize", &dequantize);
  m.impl("lora_w", &lora_w);
}

TORCH_LIBRARY(unscaled, m) {
  m.def(schema_of("lora_w"));
}
TORCH_LIBRARY_IMPL(unscaled, CompositeImplicitAutograd, m) {
  m.impl("lora_w", &lora_w_unscaled);
}

TORCH_LIBRARY(declines_dropout, m) {
  m.def(schema_of("lora_w"));
}
TORCH_LIBRARY_IMPL(declines_dropout, CompositeImplicitAutograd, m) {
  m.impl("lora_w", &lora_w_declines_dropout);
}

TORCH_LIBRARY(old_schema, m) {
  m.def("lora_w(Tensor x, Tensor[] proj, int bits, str zero_format, float scaling) -> Tensor");
}
TORCH_LIBRARY_IMPL(old_schema, CompositeImplicitAutograd, m) {
  m.impl("lora_w", &lora_w_v1);
}

TORCH_LIBRARY(no_lora_w, m) {
  m.def(schema_of("dequantize"));
}
TORCH_LIBRARY_IMPL(no_lora_w, CompositeImplicitAutograd, m) {
  m.impl("dequantize", &dequantize);
}

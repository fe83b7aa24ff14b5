#include "harness/common/tensor_bridge.h"

#include <ATen/ATen.h>

#include <cstring>

namespace gradscope::bridge {
namespace {

template <typename T, typename Source>
std::vector<T> to_vector(const at::Tensor& t) {
  const auto c = t.detach().cpu().contiguous();
  const Source* p = c.data_ptr<Source>();
  std::vector<T> out(c.numel());
  for (int64_t i = 0; i < c.numel(); ++i) std::memcpy(&out[i], &p[i], sizeof(T));
  return out;
}

}  // namespace

reference::GptqLayer to_reference(const GptqWeight& w) {
  reference::GptqLayer l;
  l.bits = w.bits;
  l.v1_zero_minus_one = w.format == ZeroPointFormat::kGptqV1;
  l.in_features = w.in_features();
  l.out_features = w.out_features();
  l.groups = w.scales.size(0);
  static_assert(sizeof(int32_t) == sizeof(uint32_t));
  l.qweight = to_vector<uint32_t, int32_t>(as_packed_words(w.qweight, "qweight"));
  l.qzeros = to_vector<uint32_t, int32_t>(as_packed_words(w.qzeros, "qzeros"));
  const auto scales = w.scales.detach().cpu().to(at::kDouble).contiguous();
  l.scales.assign(scales.data_ptr<double>(), scales.data_ptr<double>() + scales.numel());
  l.g_idx = to_vector<int32_t, int32_t>(w.g_idx);
  return l;
}

at::Tensor to_tensor(const reference::Matrix& m) {
  auto t = at::empty({m.rows(), m.cols()}, at::kDouble);
  std::memcpy(t.data_ptr<double>(), m.data(), sizeof(double) * m.size());
  return t;
}

std::string dtype_name(at::ScalarType type) {
  switch (type) {
    case at::kFloat:
      return "fp32";
    case at::kHalf:
      return "fp16";
    case at::kBFloat16:
      return "bf16";
    case at::kDouble:
      return "fp64";
    case at::kInt:
      return "int32";
    case at::kLong:
      return "int64";
    case at::kBool:
      return "bool";
    default:
      return c10::toString(type);
  }
}

report::TensorData to_tensor_data(const at::Tensor& t) {
  report::TensorData d;
  d.dtype = dtype_name(t.scalar_type());
  d.shape = t.sizes().vec();
  const auto values = t.detach().cpu().to(at::kDouble).contiguous();
  d.values.assign(values.data_ptr<double>(), values.data_ptr<double>() + values.numel());
  return d;
}

reference::Matrix to_matrix(const at::Tensor& t) {
  const auto d = t.detach().cpu().to(at::kDouble).contiguous();
  const int64_t cols = d.dim() == 0 ? 1 : d.size(-1);
  reference::Matrix m(cols == 0 ? 0 : d.numel() / cols, cols);
  std::memcpy(m.data(), d.data_ptr<double>(), sizeof(double) * d.numel());
  return m;
}

at::Tensor to_tensor(const reference::IntMatrix& m) {
  auto t = at::empty({m.rows(), m.cols()}, at::kLong);
  std::memcpy(t.data_ptr<int64_t>(), m.data(), sizeof(int64_t) * m.size());
  return t;
}

}  // namespace gradscope::bridge

#include "gradscope/quant_linear.h"

#include <ATen/ATen.h>

#include "gradscope/dequant.h"

namespace gradscope {

std::pair<int64_t, int64_t> packed_fingerprint(const at::Tensor& words) {
  const auto w = words.reshape(-1).to(at::kLong);
  const auto position = at::arange(w.numel(), w.options()).remainder(1021).add(1);
  return {w.sum().item<int64_t>(), w.mul(position).sum().item<int64_t>()};
}

QuantLinearImpl::QuantLinearImpl(const GptqWeight& weight, const at::Tensor& bias,
                                 QuantLinearOptions options)
    : options_(options),
      bits_(weight.bits),
      format_(weight.format),
      scales_dtype_(weight.scales.scalar_type()) {
  validate_gptq_weight(weight);
  const auto qweight = as_packed_words(weight.qweight, "qweight");
  const auto qzeros = as_packed_words(weight.qzeros, "qzeros");
  const bool as_params = options.storage == PackedStorage::kFloatParameters;
  TORCH_CHECK(!as_params || at::isFloatingType(options.view_dtype),
              "QuantLinear: view_dtype must be a floating dtype, got ", options.view_dtype);
  const auto keep = [&](const char* name, const at::Tensor& t, bool integer) {
    const auto value =
        integer && as_params ? as_float_view(t.contiguous(), options.view_dtype) : t.contiguous();
    return as_params ? register_parameter(name, value.clone(), /*requires_grad=*/false)
                     : register_buffer(name, value.clone());
  };
  qweight_ = keep("qweight", qweight, true);
  qzeros_ = keep("qzeros", qzeros, true);
  g_idx_ = keep("g_idx", weight.g_idx, true);
  scales_ = keep("scales", weight.scales, false);
  if (bias.defined()) bias_ = keep("bias", bias, false);
  for (const auto& [name, words] : {std::pair<const char*, at::Tensor>{"qweight", qweight},
                                    {"qzeros", qzeros},
                                    {"g_idx", weight.g_idx}}) {
    fingerprints_.push_back({name, packed_fingerprint(words)});
  }
  if (options.rank > 0) {
    const auto opts = qweight.options().dtype(options.adapter_dtype);
    lora_A = register_parameter("lora_A", at::randn({options.rank, weight.in_features()}, opts) /
                                              std::sqrt(static_cast<double>(weight.in_features())));
    lora_B = register_parameter("lora_B", at::zeros({weight.out_features(), options.rank}, opts));
  }
}

at::Tensor QuantLinearImpl::stored(const char* name) const {
  const std::string n = name;
  return n == "qweight" ? qweight_ : n == "qzeros" ? qzeros_ : g_idx_;
}

void QuantLinearImpl::check_storage_dtypes() const {
  const bool as_params = options_.storage == PackedStorage::kFloatParameters;
  const auto want = as_params ? options_.view_dtype : at::kInt;
  for (const char* name : {"qweight", "qzeros", "g_idx"}) {
    TORCH_CHECK(stored(name).scalar_type() == want, "QuantLinear: ", name, " is stored as ",
                stored(name).scalar_type(), " but was registered as ", want,
                as_params ? " (a bit-exact view of int32 words): it was cast, which destroys the "
                            "packed words (a mixed-precision param_dtype or .to(dtype)?)"
                          : "");
  }
  TORCH_CHECK(scales_.scalar_type() == scales_dtype_, "QuantLinear: scales are ",
              scales_.scalar_type(), " but were registered as ", scales_dtype_);
}

GptqWeight QuantLinearImpl::packed() const {
  check_storage_dtypes();
  return packed_from_storage(qweight_, qzeros_, scales_, g_idx_, bits_, format_);
}

void QuantLinearImpl::check_packed_intact() const {
  const auto w = packed();
  const at::Tensor words[] = {w.qweight, w.qzeros, w.g_idx};
  for (size_t i = 0; i < fingerprints_.size(); ++i) {
    const auto now = packed_fingerprint(words[i]);
    TORCH_CHECK(now == fingerprints_[i].second, "QuantLinear: ", fingerprints_[i].first,
                " no longer holds the packed words it was built with (fingerprint ", now.first, "/",
                now.second, ", expected ", fingerprints_[i].second.first, "/",
                fingerprints_[i].second.second,
                "): a numeric cast or a write reached the stored words");
  }
}

at::Tensor QuantLinearImpl::forward(const at::Tensor& x) {
  LoraProjection p;
  p.base = packed();
  p.bias = bias_;
  if (options_.rank > 0) {
    p.lora_A = lora_A;
    p.lora_B = lora_B;
    p.scaling = options_.scaling;
  }
  if (options_.rank > 0) return lora_w(x, p);
  const auto y = at::matmul(x, dequantize_gptq(p.base, x.scalar_type()));
  return bias_.defined() ? y + bias_ : y;
}

}  // namespace gradscope

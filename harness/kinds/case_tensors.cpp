#include "harness/kinds/case_tensors.h"

#include <ATen/ATen.h>

#include <algorithm>

#include "harness/checkpoint/gptq_config.h"
#include "harness/checkpoint/safetensors_file.h"
#include "harness/common/dtypes.h"
#include "harness/common/input_error.h"
#include "harness/common/tensor_bridge.h"

namespace gradscope {
namespace {

std::optional<at::ScalarType> scalar_type_of(const std::string& dtype) {
  if (dtype == "F32") return at::kFloat;
  if (dtype == "F16") return at::kHalf;
  if (dtype == "BF16") return at::kBFloat16;
  if (dtype == "I32") return at::kInt;
  return std::nullopt;
}

std::string safetensors_name(at::ScalarType t) {
  return t == at::kFloat ? "F32" : t == at::kHalf ? "F16" : t == at::kBFloat16 ? "BF16" : "I32";
}

std::string shape_text(at::IntArrayRef shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

}  // namespace

CaseTensors::CaseTensors(const std::string& path)
    : path_(path), file_(std::make_shared<const safetensors::File>(path)) {}

CaseTensors::CaseTensors(std::shared_ptr<const GivenTensors> given)
    : path_(given->source), given_(std::move(given)) {}

namespace {

const at::Tensor* find_given(const GivenTensors& given, const std::string& name) {
  for (const auto& [n, t] : given.tensors) {
    if (n == name) return &t;
  }
  return nullptr;
}

}  // namespace

bool CaseTensors::has(const std::string& name) const {
  return given_ ? find_given(*given_, name) != nullptr : file_->find(name) != nullptr;
}

std::vector<std::string> CaseTensors::names() const {
  std::vector<std::string> out;
  if (given_) {
    for (const auto& entry : given_->tensors) out.push_back(entry.first);
  } else {
    for (const auto& e : file_->header().tensors) out.push_back(e.name);
  }
  return out;
}

std::optional<at::Tensor> CaseTensors::take(const std::string& name, at::IntArrayRef shape,
                                            const std::vector<at::ScalarType>& accepted) const {
  // Named as the source names dtypes: safetensors' F32 in a file, fp32 for given tensors.
  const auto dtype_text = [&](at::ScalarType t) {
    return given_ ? bridge::dtype_name(t) : safetensors_name(t);
  };
  const safetensors::TensorEntry* e = given_ ? nullptr : file_->find(name);
  const at::Tensor* t = given_ ? find_given(*given_, name) : nullptr;
  if (e == nullptr && t == nullptr) return std::nullopt;
  const auto type = t ? std::optional<at::ScalarType>(t->scalar_type()) : scalar_type_of(e->dtype);
  const std::vector<int64_t> has_shape = t ? t->sizes().vec() : e->shape;
  const bool dtype_ok =
      type && std::find(accepted.begin(), accepted.end(), *type) != accepted.end();
  if (!dtype_ok || has_shape != shape.vec()) {
    std::string expected;
    for (size_t i = 0; i < accepted.size(); ++i) {
      expected += (i == 0                     ? ""
                   : i + 1 == accepted.size() ? " or "
                                              : ", ") +
                  dtype_text(accepted[i]);
    }
    const std::string has_dtype = !t                              ? e->dtype
                                  : dtype_facts(t->scalar_type()) ? dtype_text(*type)
                                                                  : c10::toString(*type);
    throw InputError(path_ + ": tensor " + name + " is " + has_dtype + " " + shape_text(has_shape) +
                     "; the case expects " + expected + " " + shape_text(shape));
  }
  taken_.push_back(name);
  // A copy on the host: the implementations may write into what they are given, and the
  // caller's tensor stays as it was.
  return t ? t->detach().to(at::kCPU, /*non_blocking=*/false, /*copy=*/true).contiguous()
           : from_safetensors(*file_, *e);
}

std::optional<at::Tensor> CaseTensors::floating(const std::string& name, at::IntArrayRef shape,
                                                at::ScalarType dtype) const {
  auto t = take(name, shape, {at::kFloat, at::kHalf, at::kBFloat16});
  if (!t) return t;
  if (!t->isfinite().all().item<bool>()) {
    throw InputError(path_ + ": tensor " + name + " holds a NaN or an infinity");
  }
  const auto rounded = t->to(dtype);
  if (!rounded.isfinite().all().item<bool>()) {
    throw InputError(path_ + ": tensor " + name + " overflows " + bridge::dtype_name(dtype) +
                     ", the dtype the case holds it in");
  }
  return rounded;
}

std::optional<at::Tensor> CaseTensors::exact(const std::string& name, at::IntArrayRef shape,
                                             at::ScalarType dtype) const {
  return take(name, shape, {dtype});
}

void CaseTensors::require_all_taken(const std::string& case_id) const {
  std::string unused;
  for (const auto& name : names()) {
    if (std::find(taken_.begin(), taken_.end(), name) == taken_.end()) {
      unused += (unused.empty() ? "" : ", ") + name;
    }
  }
  if (!unused.empty()) {
    throw InputError(path_ + ": case " + case_id + " draws no tensor named " + unused +
                     " (names: x, dy or dq/dk/dv; per projection <proj>.lora_A, .lora_B, "
                     ".bias, .qweight, .qzeros, .scales, .g_idx; in a stack layers.<i>.<proj> "
                     "and layers.<i>.input_norm/.post_attention_norm; docs/case-files.md)");
  }
}

}  // namespace gradscope

#include "harness/kinds/case_tensors.h"

#include <ATen/ATen.h>

#include <algorithm>

#include "harness/checkpoint/gptq_config.h"
#include "harness/checkpoint/safetensors_file.h"
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

bool CaseTensors::has(const std::string& name) const {
  return file_->find(name) != nullptr;
}

std::optional<at::Tensor> CaseTensors::take(const std::string& name, at::IntArrayRef shape,
                                            const std::vector<at::ScalarType>& accepted) const {
  const auto* e = file_->find(name);
  if (e == nullptr) return std::nullopt;
  const auto type = scalar_type_of(e->dtype);
  const bool dtype_ok =
      type && std::find(accepted.begin(), accepted.end(), *type) != accepted.end();
  if (!dtype_ok || e->shape != shape.vec()) {
    std::string expected;
    for (size_t i = 0; i < accepted.size(); ++i) {
      expected += (i == 0                     ? ""
                   : i + 1 == accepted.size() ? " or "
                                              : ", ") +
                  safetensors_name(accepted[i]);
    }
    throw InputError(path_ + ": tensor " + name + " is " + e->dtype + " " + shape_text(e->shape) +
                     "; the case expects " + expected + " " + shape_text(shape));
  }
  taken_.push_back(name);
  return from_safetensors(*file_, *e);
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
  for (const auto& e : file_->header().tensors) {
    if (std::find(taken_.begin(), taken_.end(), e.name) == taken_.end()) {
      unused += (unused.empty() ? "" : ", ") + e.name;
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

// A LoRA op kind as data (lora_w, qkv, mlp): the projections and tensors it has, by name, and
// its four implementations (prod, base, ref, floor) as callables. lora_op_kind() turns the
// declaration into a kind whose testbed generates every named input, runs the phases, takes
// the gradients of x and of every adapter and checks each named tensor.
#pragma once

#include <any>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "harness/kinds/lora_testbed.h"

namespace gradscope::lora_testbed {

template <class T>
using Named = std::map<std::string, T>;

// The tensors of one case, as the kind's fields size them.
struct LoraOpShape {
  struct ProjectionShape {
    std::string name;                 // Hugging Face name, also its streams' prefix
    int64_t in, out;                  // features
    std::string in_field, out_field;  // the case fields that size them (for error messages)
  };
  struct OutputShape {
    std::string name;  // the output's check path is <name>/output
    std::string grad;  // the stream of its output gradient
    int64_t features;
  };
  struct DropoutShape {
    std::string name;  // its mask's stream
    int64_t features;
  };
  std::vector<ProjectionShape> projections;
  int64_t in_features;     // of x
  std::string input_grad;  // x's gradient is checked as <input_grad>/input.grad
  std::vector<OutputShape> outputs;
  std::vector<DropoutShape> dropouts;
};

// One implementation's copies of the generated inputs, by name.
struct OpArgs {
  const at::Tensor& x;
  const Named<const Projection*>& projections;
  const Named<const Dropout*>& dropouts;
  Role role;
  impl::LoraArgs lora;
  const LoraProjection& projection(const std::string& name) const;
  const LoraDropout& dropout(const std::string& name) const;
};

// The reference's fp64 values of the generated inputs, by name.
struct RefArgs {
  const reference::Matrix& x;
  const Named<const Projection*>& projections;
  const Named<const Activation*>& output_grads;
  const Named<const Dropout*>& dropouts;
  const reference::Projection& projection(const std::string& name) const;
  const reference::Matrix& output_grad(const std::string& name) const;
  const reference::Dropout& dropout(const std::string& name) const;
};

// The reference's outputs and gradients, and the floor's variances, as views by name into
// the kind's own result structs, which `values` owns (a std::shared_ptr<T>; as<T>() returns
// them): large fp64 matrices are never copied, and a kind's floor reads its reference's
// structs (e.g. the MLP's tape) as they are.
template <class Grads>
struct NamedResults {
  Named<const reference::Matrix*> outputs;
  const reference::Matrix* dx = nullptr;
  Named<const Grads*> grads;
  std::any values;
  template <class T>
  const T& as() const {
    return *std::any_cast<std::shared_ptr<T>>(values);
  }
  template <class T>
  T& own(T v) {
    auto p = std::make_shared<T>(std::move(v));
    values = p;
    return *p;
  }
};
using RefResult = NamedResults<reference::ProjectionGrads>;
using FloorResult = NamedResults<reference::ProjectionGradsNoise>;

struct LoraOpDecl {
  // What the op computes, for the default base, reference and floor: each output the LoRA
  // linear of x through the projection of its name (kLinears), or a SwiGLU MLP,
  // down_proj(silu(gate_proj(x)) up_proj(x)) with masks dropout.x and dropout.h, its output
  // named down_proj and its output gradient dy (kSwigluMlp).
  enum class Body { kLinears, kSwigluMlp };
  std::string kind;  // also the first part of the case id
  Body body = Body::kLinears;
  std::string module;             // checks sit under <id>/layer0/<module>/
  std::vector<FieldSpec> fields;  // before the testbed's common fields
  std::vector<std::string> prod_ops;
  std::function<std::string(const CaseSpec&)> id_part;  // between the dtype and the common part
  std::function<LoraOpShape(const CaseSpec&)> shape;
  std::function<void(const CaseSpec&)> validate;  // the kind's own rules; may be unset
  std::function<Named<at::Tensor>(const impl::Ops&, const OpArgs&)> prod;
  // Unset: the unfused ATen composition of the body (kLinears: with the first dropout).
  std::function<Named<at::Tensor>(const OpArgs&)> base;
  // Unset (both): the body's (kLinears: with the first dropout, x's gradient the sum of the
  // outputs' in output order).
  std::function<RefResult(const RefArgs&)> ref;
  std::function<FloorResult(reference::RoundingNoise&, const RefArgs&, const RefResult&)> floor;
  // The kind's own fields of a sampled case (KindDecl::sample), before the exact zeros in x.
  std::function<void(CaseDraw&)> sample;
};

KindDecl lora_op_kind(LoraOpDecl decl);

}  // namespace gradscope::lora_testbed

// The implementation under test: the operators a case calls as "prod", found by name through
// the PyTorch dispatcher in one namespace (gradscope's own by default) whose operators follow
// the schemas of docs/implementations.md. Any library that registers such a namespace
// (TORCH_LIBRARY in C++, torch.library in Python) can be verified without changing gradscope.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <string>
#include <vector>

#include "gradscope/decoder_layer.h"
#include "gradscope/lora_ops.h"
#include "gradscope/op_schemas.h"

namespace gradscope::impl {

// The contract's operator with this name (throws std::invalid_argument for another).
const OpSchema& op_schema(const std::string& name);

// What the user chose: the namespace and the libraries loaded to register it.
struct ImplChoice {
  std::string ns = "gradscope";
  std::vector<std::string> libraries;  // --ops-library, in order
  // --import: Python modules the Python package imported to register it (python3 -m
  // gradscope), named in the replay line and in a missing operator's message.
  std::vector<std::string> imports;
  bool is_default() const { return ns == "gradscope"; }
  // gradscope's own kernels and nothing loaded or imported beside them.
  bool is_builtin() const { return is_default() && libraries.empty() && imports.empty(); }
};

// Loads each library (dlopen, global symbols, as torch.ops.load_library does); throws
// InputError naming the file and the loader's message.
void load_libraries(const std::vector<std::string>& paths);

// Throws InputError unless `ns` registers every operator in `ops` with the contract's schema
// (argument and return types in order; names and defaults are not compared): a missing
// operator names itself and its schema, a different one shows both.
// A missing operator also says what was loaded or imported to register `ns`, or that nothing was.
void require_ops(const ImplChoice& impl, const std::vector<std::string>& ops);

// Runs after every case: lets an embedding interpreter drop what an implementation's failure
// left behind. torch's autograd engine, when a Python backward node raises, puts the Python
// exception back into the calling thread's error indicator before rethrowing it as C++; left
// set, it is raised again by the next call into Python, as the next case's error. The Python
// package installs a hook that clears it (python/src/gradscope_module.cpp).
void set_after_case(std::function<void()> hook);
void after_case();

// A case the implementation declined (it lacks a feature: a dtype, a bit width, dropout):
// reported as unsupported by that implementation, apart from failures.
struct Unsupported : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// What the LoRA operators take besides the projections: the implementation derives the
// scaling from alpha and the rank (lora_A's rows) as it does in training.
struct LoraArgs {
  double alpha = 16;
  bool rslora = false;
};

// Calls the operators of one namespace (boxed, through the dispatcher, so that Python
// kernels and autograd formulas registered for them run). An operator that raises
// NotImplementedError (Python) or c10::NotImplementedError (TORCH_CHECK_NOT_IMPLEMENTED)
// throws Unsupported; any other error propagates as the implementation raised it.
class Ops;
// A decoder layer's LoRA ops as `ops`' operators, with the case's alpha and rsLoRA (no
// dropout inside a layer).
LayerLoraOps layer_ops(const Ops& ops, const LoraArgs& args);

class Ops {
 public:
  explicit Ops(std::string ns) : ns_(std::move(ns)) {}
  const std::string& ns() const { return ns_; }

  // W^T [in, out] ("in_out") or W [out, in] ("out_in") in `dtype`.
  at::Tensor dequantize(const GptqWeight& w, at::ScalarType dtype, const std::string& layout) const;
  at::Tensor lora_w(const at::Tensor& x, const LoraProjection& proj, const LoraArgs& args,
                    const LoraDropout& dropout) const;
  std::vector<at::Tensor> lora_qkv(const at::Tensor& x, const LoraProjection& q,
                                   const LoraProjection& k, const LoraProjection& v,
                                   const LoraArgs& args, const LoraDropout& dropout) const;
  at::Tensor lora_mlp(const at::Tensor& x, const LoraProjection& gate, const LoraProjection& up,
                      const LoraProjection& down, const LoraArgs& args,
                      const LoraDropout& dropout_x, const LoraDropout& dropout_h) const;
  // The whole layer (its heads, norms' epsilon, RoPE theta and first position from `layer`).
  at::Tensor decoder_layer(const at::Tensor& x, const DecoderLayer& layer,
                           const LoraArgs& args) const;

 private:
  std::string ns_;
};

}  // namespace gradscope::impl

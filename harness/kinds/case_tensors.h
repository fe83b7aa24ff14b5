// The case's own tensors (docs/case-files.md "Tensors from a file"): a safetensors file (field
// `tensors`), or tensors a host program hands the case in memory (CaseSpec::given_tensors),
// whose tensors replace the seeded draws of the same name, so a case can run on a module's own
// weights or on activations captured from a model.
#pragma once

#include <ATen/core/Tensor.h>

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace gradscope {

namespace safetensors {
class File;
}

struct GivenTensors {
  std::string source;  // what errors name, e.g. "check_module(inputs=...)"
  std::vector<std::pair<std::string, at::Tensor>> tensors;
};

class CaseTensors {
 public:
  // Maps the file; throws InputError naming it.
  explicit CaseTensors(const std::string& path);
  explicit CaseTensors(std::shared_ptr<const GivenTensors> given);
  // The file, or the given tensors' source: how messages name them.
  const std::string& path() const { return path_; }

  // The tensor called `name`, if the file has one: a floating tensor of `shape` (F32, F16 or
  // BF16) rounded once to `dtype`, as a seeded draw is. Throws InputError naming the file, the
  // tensor and what was expected.
  std::optional<at::Tensor> floating(const std::string& name, at::IntArrayRef shape,
                                     at::ScalarType dtype) const;
  // The tensor called `name`, if present, exactly of `dtype` and `shape` (packed words, scales).
  std::optional<at::Tensor> exact(const std::string& name, at::IntArrayRef shape,
                                  at::ScalarType dtype) const;
  bool has(const std::string& name) const;
  // Throws InputError naming every tensor of the file the case did not take (a misspelt name
  // would otherwise leave its seeded draw in place).
  void require_all_taken(const std::string& case_id) const;

 private:
  std::optional<at::Tensor> take(const std::string& name, at::IntArrayRef shape,
                                 const std::vector<at::ScalarType>& accepted) const;
  std::vector<std::string> names() const;
  std::string path_;
  std::shared_ptr<const safetensors::File> file_;  // or
  std::shared_ptr<const GivenTensors> given_;
  mutable std::vector<std::string> taken_;
};

}  // namespace gradscope

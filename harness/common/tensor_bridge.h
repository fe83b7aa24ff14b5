// The one place where torch tensors and the reference's Eigen matrices / plain
// arrays meet.
#pragma once

#include <ATen/core/Tensor.h>

#include "gradscope/gptq_format.h"
#include "reference/gptq_reference.h"
#include "reports/report_types.h"

namespace gradscope::bridge {

// Copies the packed words, scales and g_idx of a layer into the reference's form.
reference::GptqLayer to_reference(const GptqWeight& weight);

at::Tensor to_tensor(const reference::Matrix& m);  // fp64 [rows, cols]
// Any float tensor's values in fp64, as [numel / last dim, last dim] (rows = tokens).
reference::Matrix to_matrix(const at::Tensor& t);
at::Tensor to_tensor(const reference::IntMatrix& m);  // int64 [rows, cols]

// fp32 fp16 bf16 fp64 int32 int64 bool (the names dumps and reports use).
std::string dtype_name(at::ScalarType type);
// A tensor's shape, dtype name and values (in fp64) for report writers.
report::TensorData to_tensor_data(const at::Tensor& t);

}  // namespace gradscope::bridge

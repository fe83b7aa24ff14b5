// Eigen's own product, C = A B, as the reference computed its products before
// reference/dense_product.h: the benchmark's third column.
#pragma once

#include "reference/gptq_reference.h"

namespace gradscope::bench {

void eigen_product(const reference::Matrix& a, const reference::Matrix& b, reference::Matrix& c);

}  // namespace gradscope::bench

#include "eigen_product.h"

namespace gradscope::bench {

void eigen_product(const reference::Matrix& a, const reference::Matrix& b, reference::Matrix& c) {
  c.noalias() = a * b;
}

}  // namespace gradscope::bench

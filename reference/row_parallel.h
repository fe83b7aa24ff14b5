// Rows (or other independent items) of the reference spread over OpenMP threads. Each
// item is computed by one thread in the same order whatever the thread count, so threads
// change the speed, never a value. Only reference/*.cpp include this (they build with
// OpenMP); Eigen's own GEMMs run single-threaded inside such a loop.
#pragma once

#include <cstdint>

namespace gradscope::reference {

template <class Body>
void for_each_row(int64_t rows, const Body& body) {
#pragma omp parallel for schedule(static)
  for (int64_t row = 0; row < rows; ++row) body(row);
}

}  // namespace gradscope::reference

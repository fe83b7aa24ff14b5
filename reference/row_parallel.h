// Rows (or other independent items) of the reference spread over OpenMP threads. Each
// item is computed by one thread in the same order whatever the thread count, so threads
// change the speed, never a value. Only reference/*.cpp include this (they build with
// OpenMP); Eigen's own GEMMs run single-threaded inside such a loop.
#pragma once

#include <cstdint>
#include <exception>

namespace gradscope::reference {

template <class Body>
void for_each_row(int64_t rows, const Body& body) {
  // An exception may not leave an OpenMP region (it would terminate the process): the
  // first one is kept and rethrown on the calling thread, e.g. an allocation failure.
  std::exception_ptr error;
#pragma omp parallel for schedule(static)
  for (int64_t row = 0; row < rows; ++row) {
    try {
      body(row);
    } catch (...) {
#pragma omp critical(gradscope_reference_row_error)
      if (!error) error = std::current_exception();
    }
  }
  if (error) std::rethrow_exception(error);
}

}  // namespace gradscope::reference

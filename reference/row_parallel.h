// Rows (or other independent items) of the reference spread over OpenMP threads. Each
// item is computed by one thread in the same order whatever the thread count, so threads
// change the speed, never a value. Only reference/*.cpp include this (they build with
// OpenMP); a product (dense_product.h) or another such loop inside one runs on the calling
// thread.
#pragma once

#include <omp.h>

#include <cstdint>
#include <exception>

namespace gradscope::reference {

// `dynamic`: each thread takes the next item when it is done with one (items whose cost varies
// with what the other threads are doing, e.g. GEMM tiles sharing memory bandwidth), on at most
// `max_threads` threads (0: no bound); else the items are dealt out in equal contiguous chunks.
// Which thread computes an item never changes what it computes.
template <class Body>
void for_each_row(int64_t rows, const Body& body, bool dynamic = false, int max_threads = 0) {
  // An exception may not leave an OpenMP region (it would terminate the process): the
  // first one is kept and rethrown on the calling thread, e.g. an allocation failure.
  std::exception_ptr error;
  const auto guarded = [&](int64_t row) {
    try {
      body(row);
    } catch (...) {
#pragma omp critical(gradscope_reference_row_error)
      if (!error) error = std::current_exception();
    }
  };
  // Inside another parallel region (attention's heads) the items run on the calling thread: a
  // nested region would only add a team of one per call.
  if (rows <= 1 || omp_get_level() > 0) {
    for (int64_t row = 0; row < rows; ++row) body(row);
  } else if (dynamic) {
    const int threads = max_threads > 0 && max_threads < omp_get_max_threads()
                            ? max_threads
                            : omp_get_max_threads();
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
    for (int64_t row = 0; row < rows; ++row) guarded(row);
  } else {
#pragma omp parallel for schedule(static)
    for (int64_t row = 0; row < rows; ++row) guarded(row);
  }
  if (error) std::rethrow_exception(error);
}

}  // namespace gradscope::reference

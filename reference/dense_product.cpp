#include "reference/dense_product.h"

#include <cblas.h>

#include <limits>
#include <mutex>
#include <stdexcept>
#include <string>

#include "reference/row_parallel.h"

namespace gradscope::reference {
namespace {

// The wheel's OpenBLAS keeps packing buffers for 64 threads (MAX_THREADS=64); more threads
// calling it at once can exhaust them, which OpenBLAS answers by terminating the process.
constexpr int kMaxCallingThreads = 64;

// OpenBLAS runs each call on the calling thread: the tiles are the parallelism.
void single_threaded_blas() {
  static std::once_flag once;
  std::call_once(once, [] { scipy_openblas_set_num_threads(1); });
}

blasint dim(int64_t v, const char* what) {
  if (v > std::numeric_limits<blasint>::max()) {
    throw std::length_error(std::string("reference product: ") + what + " " + std::to_string(v) +
                            " exceeds the BLAS's 32-bit dimensions");
  }
  return static_cast<blasint>(v);
}

}  // namespace

void gemm(double alpha, const Matrix& a, Op op_a, const Matrix& b, Op op_b, double beta,
          Matrix& c) {
  const bool ta = op_a == Op::kTransposed, tb = op_b == Op::kTransposed;
  const int64_t m = ta ? a.cols() : a.rows(), k = ta ? a.rows() : a.cols();
  const int64_t kb = tb ? b.cols() : b.rows(), n = tb ? b.rows() : b.cols();
  if (k != kb || c.rows() != m || c.cols() != n) {
    throw std::logic_error("reference product: shapes do not match");
  }
  if (m == 0 || n == 0) return;
  if (k == 0) {
    if (beta == 0) {
      c.setZero();
    } else {
      c *= beta;
    }
    return;
  }
  single_threaded_blas();
  const blasint lda = dim(a.cols(), "a row"), ldb = dim(b.cols(), "a row"),
                ldc = dim(c.cols(), "a row");
  const blasint kk = dim(k, "an inner dimension");
  const int64_t row_tiles = (m + kTileRows - 1) / kTileRows;
  const int64_t col_tiles = (n + kTileCols - 1) / kTileCols;
  for_each_row(
      row_tiles * col_tiles,
      [&](int64_t t) {
        const int64_t i = t / col_tiles * kTileRows, j = t % col_tiles * kTileCols;
        const auto mt = static_cast<blasint>(std::min(kTileRows, m - i));
        const auto nt = static_cast<blasint>(std::min(kTileCols, n - j));
        // Row-major: op(A)'s rows i.. start at row i of A, or at column i of a transposed A;
        // op(B)'s columns j.. at column j of B, or at row j of a transposed B.
        const double* pa = ta ? a.data() + i : a.data() + i * a.cols();
        const double* pb = tb ? b.data() + j * b.cols() : b.data() + j;
        scipy_cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans,
                          tb ? CblasTrans : CblasNoTrans, mt, nt, kk, alpha, pa, lda, pb, ldb, beta,
                          c.data() + i * c.cols() + j, ldc);
      },
      /*dynamic=*/true, kMaxCallingThreads);
}

Matrix product(const Matrix& a, Op op_a, const Matrix& b, Op op_b, double alpha) {
  Matrix c(op_a == Op::kTransposed ? a.cols() : a.rows(),
           op_b == Op::kTransposed ? b.rows() : b.cols());
  gemm(alpha, a, op_a, b, op_b, 0.0, c);
  return c;
}

}  // namespace gradscope::reference

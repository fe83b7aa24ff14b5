// The reference's tiled products (reference/dense_product.h): each transpose combination
// against a plain triple loop, shapes at the tiles' edges, alpha/beta, and the same bits
// whatever the thread count; the same for the fp32 products of nonnegative operands, with
// operands whose elements span more than fp32's range and operands that are not finite.
#include "reference/dense_product.h"

#include <cblas.h>
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#if defined(__SSE__)
#include <pmmintrin.h>
#include <xmmintrin.h>
#endif

namespace gradscope::reference {
namespace {

Matrix random_matrix(int64_t rows, int64_t cols, uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::normal_distribution<double> normal;
  Matrix m(rows, cols);
  for (int64_t i = 0; i < m.size(); ++i) m.data()[i] = normal(gen);
  return m;
}

// op(A) op(B) by the definition, summed in long double: the slow, obviously correct product.
Matrix naive(const Matrix& a, Op op_a, const Matrix& b, Op op_b) {
  const Matrix ea = op_a == Op::kTransposed ? Matrix(a.transpose()) : a;
  const Matrix eb = op_b == Op::kTransposed ? Matrix(b.transpose()) : b;
  Matrix c(ea.rows(), eb.cols());
  for (int64_t i = 0; i < c.rows(); ++i) {
    for (int64_t j = 0; j < c.cols(); ++j) {
      long double sum = 0;
      for (int64_t k = 0; k < ea.cols(); ++k) sum += (long double)ea(i, k) * eb(k, j);
      c(i, j) = static_cast<double>(sum);
    }
  }
  return c;
}

bool same_bits(const Matrix& x, const Matrix& y) {
  return x.rows() == y.rows() && x.cols() == y.cols() &&
         std::memcmp(x.data(), y.data(), sizeof(double) * x.size()) == 0;
}

struct Shape {
  int64_t m, n, k;
};

// One tile, tiles with a remainder row and column (2^k + 1), an inner dimension of 1.
class DenseProduct : public ::testing::TestWithParam<Shape> {};

TEST_P(DenseProduct, EveryTransposeMatchesTheDefinition) {
  const auto [m, n, k] = GetParam();
  for (const Op op_a : {Op::kPlain, Op::kTransposed}) {
    for (const Op op_b : {Op::kPlain, Op::kTransposed}) {
      const Matrix a = op_a == Op::kPlain ? random_matrix(m, k, 1) : random_matrix(k, m, 1);
      const Matrix b = op_b == Op::kPlain ? random_matrix(k, n, 2) : random_matrix(n, k, 2);
      const Matrix c0 = random_matrix(m, n, 3);
      Matrix c = c0;
      gemm(0.5, a, op_a, b, op_b, 2.0, c);
      const Matrix expected = 0.5 * naive(a, op_a, b, op_b) + 2.0 * c0;
      // fp64 products of K normal terms: a few ulps of sqrt(K) per element.
      const double tol = 1e-13 * (1.0 + std::sqrt(double(k)));
      EXPECT_LE((c - expected).cwiseAbs().maxCoeff(), tol)
          << "m " << m << " n " << n << " k " << k << " op_a " << int(op_a) << " op_b "
          << int(op_b);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, DenseProduct,
                         ::testing::Values(Shape{1, 1, 1}, Shape{3, 5, 7},
                                           Shape{kTileRows + 1, kTileCols + 1, 33},
                                           Shape{2 * kTileRows - 1, 17, 1},
                                           Shape{5, 2 * kTileCols + 3, 9}));

// Squares of normal draws with an all-zero row of op(A) and column of op(B), and one row
// scaled by 2^300 and one column by 2^-300 (their products scaled alike: no flush).
Matrix nonnegative(int64_t rows, int64_t cols, uint64_t seed, bool zero_first_row,
                   bool zero_first_col) {
  Matrix m = random_matrix(rows, cols, seed).cwiseAbs2();
  if (zero_first_row) m.row(0).setZero();
  if (zero_first_col) m.col(0).setZero();
  if (rows > 2) m.row(rows - 1) *= std::ldexp(1.0, 300);
  if (cols > 2) m.col(cols - 1) *= std::ldexp(1.0, -300);
  return m;
}

TEST_P(DenseProduct, NonnegativeMatchesTheDefinitionToFp32sBound) {
  const auto [m, n, k] = GetParam();
  for (const Op op_a : {Op::kPlain, Op::kTransposed}) {
    for (const Op op_b : {Op::kPlain, Op::kTransposed}) {
      const bool pa = op_a == Op::kPlain, pb = op_b == Op::kPlain;
      const Matrix a = pa ? nonnegative(m, k, 1, true, false) : nonnegative(k, m, 1, false, true);
      const Matrix b = pb ? nonnegative(k, n, 2, false, true) : nonnegative(n, k, 2, true, false);
      const Matrix c0 = random_matrix(m, n, 3);
      Matrix c = c0;
      gemm_nonnegative(0.5, a, op_a, b, op_b, c);
      const Matrix exact = 0.5 * naive(a, op_a, b, op_b);
      // The bound of gemm_nonnegative: (K + 2) 2^-24 of each element, and c0's own rounding.
      const double rel = double(k + 2) * std::ldexp(1.0, -24);
      for (int64_t i = 0; i < m; ++i) {
        for (int64_t j = 0; j < n; ++j) {
          const double tol = rel * exact(i, j) + 4e-16 * (std::abs(c0(i, j)) + exact(i, j));
          ASSERT_LE(std::abs(c(i, j) - c0(i, j) - exact(i, j)), tol)
              << "element (" << i << ", " << j << ") of m " << m << " n " << n << " k " << k
              << " op_a " << int(op_a) << " op_b " << int(op_b);
        }
      }
    }
  }
}

TEST_P(DenseProduct, NonnegativeSquaresASignedBWithoutMaterialisingIt) {
  const auto [m, n, k] = GetParam();
  for (const Op op_b : {Op::kPlain, Op::kTransposed}) {
    const Matrix a = nonnegative(m, k, 8, false, false);
    Matrix b = op_b == Op::kPlain ? random_matrix(k, n, 9) : random_matrix(n, k, 9);
    if (b.rows() > 2) b.row(0) *= std::ldexp(1.0, 200);
    Matrix c = Matrix::Zero(m, n);
    gemm_nonnegative(2.0, a, Op::kPlain, b, op_b, c, /*square_b=*/true);
    const Matrix exact = 2.0 * naive(a, Op::kPlain, b.cwiseAbs2(), op_b);
    const double rel = double(k + 2) * std::ldexp(1.0, -24);
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        ASSERT_LE(std::abs(c(i, j) - exact(i, j)), rel * exact(i, j))
            << "element (" << i << ", " << j << ") of m " << m << " n " << n << " k " << k
            << " op_b " << int(op_b);
      }
    }
  }
  // A square that overflows: the fp64 product of the squares (inf where it reaches).
  Matrix a = Matrix::Constant(2, 2, 1.0), b = Matrix::Constant(2, 2, 1.0);
  b(0, 0) = 1e200;
  Matrix c = Matrix::Zero(2, 2);
  gemm_nonnegative(1.0, a, Op::kPlain, b, Op::kPlain, c, /*square_b=*/true);
  EXPECT_TRUE(std::isinf(c(0, 0)) && c(0, 1) == 2.0);
}

// (B + s L R)^2 formed block by block inside the product against the same operand formed whole
// first: within fp32's bound of the definition, in both of B's layouts, with B's rows crossing
// the blocks' grid (2^k + 1) and a scaled outlier row.
TEST_P(DenseProduct, NonnegativeFormsALowRankSumBlockByBlock) {
  const auto [m, n, k_param] = GetParam();
  for (const int64_t k : {k_param, int64_t{129}}) {
    for (const Op op_b : {Op::kPlain, Op::kTransposed}) {
      const int64_t rows = op_b == Op::kPlain ? k : n, cols = op_b == Op::kPlain ? n : k;
      const int64_t r = 3;
      const double s = 0.75;
      const Matrix a = nonnegative(m, k, 30, false, false);
      Matrix b = random_matrix(rows, cols, 31);
      if (rows > 2) b.row(1) *= std::ldexp(1.0, 100);
      const Matrix left = random_matrix(rows, r, 32), right = random_matrix(r, cols, 33);
      const Matrix sum = b + s * left * right;
      const Matrix magnitude = b.cwiseAbs() + s * left.cwiseAbs() * right.cwiseAbs();
      Matrix c = Matrix::Zero(m, n);
      gemm_nonnegative(2.0, a, Op::kPlain, NonnegativeOperand{b, true, &left, &right, s}, op_b, c);
      const Matrix exact = 2.0 * naive(a, Op::kPlain, sum.cwiseAbs2(), op_b);
      // B + s L R summed in another order rounds differently: a few fp64 ulps of its magnitude.
      const Matrix slack = 2.0 * naive(a, Op::kPlain, magnitude.cwiseAbs2(), op_b);
      const double rel = double(k + 2) * std::ldexp(1.0, -24);
      for (int64_t i = 0; i < m; ++i) {
        for (int64_t j = 0; j < n; ++j) {
          ASSERT_LE(std::abs(c(i, j) - exact(i, j)), rel * exact(i, j) + 1e-14 * slack(i, j))
              << "element (" << i << ", " << j << ") of m " << m << " n " << n << " k " << k
              << " op_b " << int(op_b);
        }
      }
    }
  }
}

// A low-rank sum that is not finite takes the fp64 path, as a stored operand does; a low-rank
// term on an operand that is not squared, or with shapes that do not fit, is refused.
TEST(DenseProduct, NonnegativeLowRankEdges) {
  const Matrix a = Matrix::Constant(2, 3, 1.0), left = Matrix::Constant(3, 1, 1.0),
               right = Matrix::Constant(1, 2, 1.0);
  Matrix b = Matrix::Constant(3, 2, 1.0);
  b(1, 1) = std::numeric_limits<double>::infinity();
  Matrix c = Matrix::Zero(2, 2);
  gemm_nonnegative(1.0, a, Op::kPlain, NonnegativeOperand{b, true, &left, &right, 1.0}, Op::kPlain,
                   c);
  EXPECT_EQ(c(0, 0), 12.0);  // three (1 + 1)^2
  EXPECT_TRUE(std::isinf(c(1, 1)));
  const Matrix finite = Matrix::Constant(3, 2, 1.0), wrong = Matrix::Constant(2, 2, 1.0);
  EXPECT_THROW(
      gemm_nonnegative(1.0, a, Op::kPlain, NonnegativeOperand{finite, false, &left, &right, 1.0},
                       Op::kPlain, c),
      std::logic_error);
  EXPECT_THROW(
      gemm_nonnegative(1.0, a, Op::kPlain, NonnegativeOperand{finite, true, &wrong, &right, 1.0},
                       Op::kPlain, c),
      std::logic_error);
}

// A low-rank sum on the paths its values alone decide. Column 0 of W + L R is (0, 3, 0): row 0
// of A, huge where it is 0 and tiny where it is 3, makes C(0, 0) = 9 * 2^-500, which fp32
// flushes and fp64 recomputes from the sum (from W alone it would be about 2^600). Column 2
// sums to exact zeros (a zero scale); column 3 is W = 2^-200 plus L R of order 1, whose squares
// overflow fp32 if the scales were taken from W alone.
TEST(DenseProduct, NonnegativeLowRankSumDecidesScalesAndTheFp64Path) {
  const double tiny = std::ldexp(1.0, -200);
  Matrix w(3, 4), left(3, 1), right(1, 4), a(2, 3);
  w << -1, 1, -1, tiny, 1, 1, -2, tiny, 2, 1, 2, tiny;
  left << 1, 2, -2;
  right << 1, 0.5, 1, 1;
  a << std::ldexp(1.0, 600), std::ldexp(1.0, -500), 0, 1, 1, 1;
  Matrix c = Matrix::Zero(2, 4);
  gemm_nonnegative(1.0, a, Op::kPlain, NonnegativeOperand{w, true, &left, &right, 1.0}, Op::kPlain,
                   c);
  EXPECT_EQ(c(0, 0), 9 * std::ldexp(1.0, -500));
  EXPECT_EQ(c(0, 2), 0.0);
  EXPECT_EQ(c(1, 2), 0.0);
  const Matrix sum = w + left * right;
  const Matrix exact = naive(a, Op::kPlain, sum.cwiseAbs2(), Op::kPlain);
  for (const auto& [i, j] : {std::pair{0, 1}, {0, 3}, {1, 0}, {1, 1}, {1, 3}}) {
    EXPECT_LE(std::abs(c(i, j) - exact(i, j)), std::ldexp(1.0, -20) * exact(i, j))
        << "element (" << i << ", " << j << ")";
  }
}

TEST(DenseProduct, NonnegativeComputesFlushedElementsAgainInFp64) {
  // Row 0 of A: a huge element where B's column 0 is zero and a tiny one where it is not. For
  // its row's scale the product is 2^-1100: fp32 flushes it, fp64 does not.
  Matrix a = Matrix::Constant(2, 3, 1.0), b = Matrix::Constant(3, 2, 1.0);
  a(0, 0) = std::ldexp(1.0, 600);
  a(0, 1) = std::ldexp(1.0, -500);
  a(0, 2) = 0.0;
  b(0, 0) = 0.0;
  b(1, 0) = 3.0;
  b(2, 0) = 0.0;
  Matrix c = Matrix::Zero(2, 2);
  gemm_nonnegative(1.0, a, Op::kPlain, b, Op::kPlain, c);
  EXPECT_EQ(c(0, 0), 3.0 * std::ldexp(1.0, -500));
  EXPECT_EQ(c(1, 0), 3.0);
  EXPECT_EQ(c(0, 1), std::ldexp(1.0, 600) + std::ldexp(1.0, -500));
}

// A row of A and a column of B whose largest elements are below fp64's normal range (a
// gradient's square where attention probabilities underflowed): their scales must stay
// finite, and the product keeps its bound (before, 2^-e overflowed and the floor was NaN).
// B stored, stored transposed, and given by its roots (squared where the product reads it).
TEST(DenseProduct, NonnegativeRowsAndColumnsOfSubnormalsKeepTheBound) {
  Matrix a = nonnegative(4, 6, 21, false, false), b = nonnegative(6, 5, 22, false, false);
  Matrix root = nonnegative(6, 5, 23, false, false);
  for (int64_t q = 0; q < 6; ++q) {
    a(1, q) = std::ldexp(1.0 + q, -1064 + q);  // 2^-1064 .. 6 2^-1059
    b(q, 3) = std::ldexp(3.0 + q, -1060);
    root(q, 3) = std::ldexp(1.0 + q, -532);  // squares 2^-1064 .. 36 2^-1064
  }
  const auto expect_bound = [&](const Matrix& c, const Matrix& exact, const char* how) {
    ASSERT_TRUE(c.allFinite()) << how;
    for (int64_t i = 0; i < c.rows(); ++i) {
      for (int64_t j = 0; j < c.cols(); ++j) {
        EXPECT_LE(
            std::abs(c(i, j) - exact(i, j)),
            std::ldexp(1.0, -20) * exact(i, j) + 8 * std::numeric_limits<double>::denorm_min())
            << "element (" << i << ", " << j << "), " << how;
      }
    }
  };
  const Matrix exact = naive(a, Op::kPlain, b, Op::kPlain);
  Matrix c = Matrix::Zero(4, 5);
  gemm_nonnegative(1.0, a, Op::kPlain, b, Op::kPlain, c);
  expect_bound(c, exact, "B stored");
  const Matrix bt = b.transpose();
  c.setZero();
  gemm_nonnegative(1.0, a, Op::kPlain, bt, Op::kTransposed, c);
  expect_bound(c, exact, "B stored transposed");
  c.setZero();
  gemm_nonnegative(1.0, a, Op::kPlain, root, Op::kPlain, c, /*square_b=*/true);
  expect_bound(c, naive(a, Op::kPlain, root.cwiseAbs2(), Op::kPlain), "B given by its roots");
}

TEST(DenseProduct, NonnegativeWithANonFiniteOperandIsTheFp64Product) {
  Matrix a = nonnegative(5, 7, 6, false, false), b = nonnegative(7, 4, 7, false, false);
  a(2, 3) = std::numeric_limits<double>::infinity();
  b(1, 1) = std::numeric_limits<double>::quiet_NaN();
  Matrix c = Matrix::Zero(5, 4), expected = Matrix::Zero(5, 4);
  gemm_nonnegative(1.0, a, Op::kPlain, b, Op::kPlain, c);
  gemm(1.0, a, Op::kPlain, b, Op::kPlain, 1.0, expected);
  EXPECT_TRUE(same_bits(c, expected));
}

// The fp32 products run with subnormals flushed (FTZ/DAZ): the elements whose terms were
// subnormal in fp32 stay within the bound, and afterwards no thread flushes (the reference's
// fp64 values go down to subnormals).
TEST(DenseProduct, NonnegativeLeavesEveryThreadsSubnormalsAsTheyWere) {
  // Several tiles, so that the pool's threads take some; in row i of A and column j of B, half
  // the elements are 2^-70 of the largest: their products (2^-140) are subnormal in fp32.
  const int64_t m = 2 * kTileRows + 1, n = 2 * kTileCols + 1, k = 64;
  Matrix a = nonnegative(m, k, 10, false, false), b = nonnegative(k, n, 11, false, false);
  for (int64_t p = 0; p < k; p += 2) {
    a.col(p) *= std::ldexp(1.0, -70);
    b.row(p) *= std::ldexp(1.0, -70);
  }
  Matrix c = Matrix::Zero(m, n);
  gemm_nonnegative(1.0, a, Op::kPlain, b, Op::kPlain, c);
  const Matrix exact = naive(a, Op::kPlain, b, Op::kPlain);
  const double rel = double(k + 3) * std::ldexp(1.0, -24);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      ASSERT_LE(std::abs(c(i, j) - exact(i, j)), rel * exact(i, j)) << "element " << i << ", " << j;
    }
  }
#if defined(__SSE__)
  int flushing_threads = 0;
#pragma omp parallel reduction(+ : flushing_threads)
  flushing_threads += (_mm_getcsr() & (_MM_FLUSH_ZERO_ON | _MM_DENORMALS_ZERO_ON)) != 0;
  EXPECT_EQ(flushing_threads, 0);
#endif
}

TEST(DenseProduct, SameBitsWhateverTheThreadCount) {
  // Several tiles each way, and a remainder tile in both.
  const Matrix a = random_matrix(3 * kTileRows + 7, 129, 4);
  const Matrix b = random_matrix(129, 2 * kTileCols + 5, 5);
  const int threads = omp_get_max_threads();
  Matrix one, many;
  omp_set_num_threads(1);
  one = product(a, b);
  for (const int t : {2, 4}) {
    omp_set_num_threads(t);
    many = product(a, b);
    EXPECT_TRUE(same_bits(one, many)) << t << " threads";
  }
  // The fp32 products of nonnegative operands, op(A) transposed so its scales run along A's
  // columns (blocks of columns over the threads).
  const Matrix a2t = a.cwiseAbs2().transpose(), b2 = b.cwiseAbs2();
  const Matrix zero = Matrix::Zero(a.rows(), b.cols());
  Matrix one2 = zero;
  omp_set_num_threads(1);
  gemm_nonnegative(1.0, a2t, Op::kTransposed, b2, Op::kPlain, one2);
  for (const int t : {2, 4}) {
    omp_set_num_threads(t);
    Matrix many2 = zero;
    gemm_nonnegative(1.0, a2t, Op::kTransposed, b2, Op::kPlain, many2);
    EXPECT_TRUE(same_bits(one2, many2)) << t << " threads";
  }
  // A low-rank sum squared, formed by blocks: B's 129 rows cross the blocks' grid, in both of
  // B's layouts (its scales by rows and by columns).
  const Matrix left = random_matrix(129, 4, 6), right = random_matrix(4, b.cols(), 7);
  const Matrix left_t = random_matrix(b.cols(), 4, 6), right_t = random_matrix(4, 129, 7);
  const Matrix bt = b.transpose();
  const auto low_rank = [&](Op op_b) {
    Matrix c = zero;
    const bool plain = op_b == Op::kPlain;
    gemm_nonnegative(1.0, a2t, Op::kTransposed,
                     plain ? NonnegativeOperand{b, true, &left, &right, 0.5}
                           : NonnegativeOperand{bt, true, &left_t, &right_t, 0.5},
                     op_b, c);
    return c;
  };
  for (const Op op_b : {Op::kPlain, Op::kTransposed}) {
    omp_set_num_threads(1);
    const Matrix one3 = low_rank(op_b);
    for (const int t : {2, 4}) {
      omp_set_num_threads(t);
      EXPECT_TRUE(same_bits(one3, low_rank(op_b))) << t << " threads, op_b " << int(op_b);
    }
  }
  // Rank 16 with B's 200 columns in one block of columns: its scales are one item, on the
  // calling thread, whose blocks must not start threads of their own.
  const Matrix narrow = random_matrix(129, 200, 8), left16 = random_matrix(129, 16, 9),
               right16 = random_matrix(16, 200, 10);
  const auto rank16 = [&] {
    Matrix c = Matrix::Zero(a.rows(), 200);
    gemm_nonnegative(1.0, a2t, Op::kTransposed,
                     NonnegativeOperand{narrow, true, &left16, &right16, 0.25}, Op::kPlain, c);
    return c;
  };
  omp_set_num_threads(1);
  const Matrix one4 = rank16();
  for (const int t : {2, 4}) {
    omp_set_num_threads(t);
    EXPECT_TRUE(same_bits(one4, rank16())) << t << " threads, rank 16";
  }
  omp_set_num_threads(threads);
}

// gemm_nonnegative's taller tiles: the grid follows the product's shape alone.
TEST(DenseProduct, NonnegativeTilesFollowTheShapeAlone) {
  EXPECT_EQ(nonnegative_tiles(2048, 28672).rows, 768);  // a 70B MLP's up projection
  EXPECT_EQ(nonnegative_tiles(2048, 4096).rows, 384);   // too few tiles at 768 rows
  EXPECT_EQ(nonnegative_tiles(2048, 1024).rows, kTileRows);
  EXPECT_EQ(nonnegative_tiles(1, 1).rows, kTileRows);
  EXPECT_EQ(nonnegative_tiles(2048, 28672).cols, kNonnegativeTileCols);
}

// Tiles of 768 rows with a remainder row and column (2 * 768 + 1, 21 * 384 + 1): the bound
// at every element, and the same bits at 1, 2 and 4 threads.
TEST(DenseProduct, NonnegativeTallTilesKeepTheBoundAndTheBits) {
  const int64_t m = 2 * 768 + 1, n = 21 * kNonnegativeTileCols + 1, k = 5;
  ASSERT_EQ(nonnegative_tiles(m, n).rows, 768);
  const Matrix a = nonnegative(k, m, 12, false, true), b = nonnegative(k, n, 13, false, true);
  const Matrix exact = naive(a, Op::kTransposed, b, Op::kPlain);
  const int threads = omp_get_max_threads();
  Matrix one;
  for (const int t : {1, 2, 4}) {
    omp_set_num_threads(t);
    Matrix c = Matrix::Zero(m, n);
    gemm_nonnegative(1.0, a, Op::kTransposed, b, Op::kPlain, c);
    if (t == 1) {
      one = c;
      const double rel = double(k + 2) * std::ldexp(1.0, -24);
      for (int64_t i = 0; i < m; ++i) {
        for (int64_t j = 0; j < n; ++j) {
          ASSERT_LE(std::abs(c(i, j) - exact(i, j)), rel * exact(i, j))
              << "element (" << i << ", " << j << ")";
        }
      }
    } else {
      EXPECT_TRUE(same_bits(one, c)) << t << " threads";
    }
  }
  omp_set_num_threads(threads);
}

// A stand-in for a device (the harness hands a case's GPU to the floor): the fp32 product by the
// BLAS (not instrumented, so the sanitizer build runs these tests at the BLAS's speed),
// single-threaded as gemm_nonnegative sets it; `breaks` spoils it after computing it. With
// `any_shape` it takes products of every shape, so the device's path runs at small shapes: the
// operands' conversion, the check's passes and the element-wise comparisons are instrumented in
// the sanitizer build and cost there in proportion to the matrices' sizes.
class BlasFp32Device : public Fp32Device {
 public:
  std::string name() const override { return "blas-fp32"; }
  bool takes(int64_t m, int64_t n, int64_t k) const override {
    return any_shape || Fp32Device::takes(m, n, k);
  }
  bool multiply(const Fp32Product& p, float* c) override {
    ++calls;
    using Floats = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
    scipy_cblas_sgemm(CblasRowMajor, p.ta ? CblasTrans : CblasNoTrans,
                      p.tb ? CblasTrans : CblasNoTrans, static_cast<blasint>(p.m),
                      static_cast<blasint>(p.n), static_cast<blasint>(p.k), 1.0f, p.a,
                      static_cast<blasint>(p.ta ? p.m : p.k), p.b,
                      static_cast<blasint>(p.tb ? p.k : p.n), 0.0f, c, static_cast<blasint>(p.n));
    Eigen::Map<Floats> out(c, p.m, p.n);
    if (breaks) breaks(out);
    seen = {p.a, p.b, c};
    return !declines;
  }
  // With `stages`, buffers of its own, as a GPU's page-locked memory.
  float* staging(int slot, int64_t count) override {
    if (!stages || (only_slot >= 0 && slot != only_slot)) return nullptr;
    buffers[slot].assign(static_cast<size_t>(count), std::numeric_limits<float>::quiet_NaN());
    return buffers[slot].data();
  }
  bool stages = false;
  int only_slot = -1;  // >= 0: that slot alone is staged (as where an allocation fails)
  std::vector<float> buffers[3];
  std::vector<const float*> seen;  // the last product's A, B and C
  std::function<void(
      Eigen::Map<Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>>&)>
      breaks;
  bool declines = false;
  bool any_shape = true;
  int calls = 0;
};

// The smallest cube worth a device (its operands' transfers against its multiply-adds), and the
// shape of the device's products below: m, n and k distinct, none a multiple of a tile, two or
// more of the check's tiles (512 x 256) across B and of the host's product tiles down C, k as
// a real layer's (the bound (k + 3) 2^-24 is 1.2e-4).
constexpr int64_t kDeviceCube = 1536;
constexpr Shape kDeviceShape{197, 263, 2000};

TEST(DenseProduct, OnlyProductsWorthTheirTransfersGoToADevice) {
  EXPECT_TRUE(worth_a_device(kDeviceCube, kDeviceCube, kDeviceCube));
  EXPECT_FALSE(worth_a_device(kDeviceCube - 1, kDeviceCube - 1, kDeviceCube - 1));
  EXPECT_TRUE(worth_a_device(1600, 1800, 2000));
  EXPECT_FALSE(worth_a_device(kDeviceShape.m, kDeviceShape.n, kDeviceShape.k));
  EXPECT_TRUE(worth_a_device(2048, 28672, 8192));  // a 70B MLP's projection over 2048 tokens
  EXPECT_FALSE(worth_a_device(16, 28672, 8192));   // an adapter's product: thin
  BlasFp32Device device;
  device.any_shape = false;
  EXPECT_TRUE(device.takes(kDeviceCube, kDeviceCube, kDeviceCube));
  EXPECT_FALSE(device.takes(kDeviceShape.m, kDeviceShape.n, kDeviceShape.k));
  const Fp32ProductsOn on(&device);
  const int64_t s = kDeviceCube - 1;
  const Matrix a = random_matrix(s, s, 20).cwiseAbs2(), b = random_matrix(s, s, 21).cwiseAbs2();
  Matrix c = Matrix::Zero(s, s);
  gemm_nonnegative(1.0, a, Op::kPlain, b, Op::kPlain, c);
  EXPECT_EQ(device.calls, 0);
}

// A device's products in every transpose combination, m, n and k distinct, with operands
// spanning more than fp32's range (rows scaled by 2^300, columns by 2^-300) and B squared by
// the product: within the bound of the fp64 product, as the host's.
TEST(DenseProduct, NonnegativeOnADeviceKeepsTheBound) {
  const auto [m, n, k] = kDeviceShape;
  BlasFp32Device device;
  for (const Op op_a : {Op::kPlain, Op::kTransposed}) {
    for (const Op op_b : {Op::kPlain, Op::kTransposed}) {
      const bool pa = op_a == Op::kPlain, pb = op_b == Op::kPlain;
      const Matrix a = pa ? nonnegative(m, k, 22, true, false) : nonnegative(k, m, 22, false, true);
      const Matrix b = pb ? random_matrix(k, n, 23) : random_matrix(n, k, 23);
      Matrix exact = Matrix::Zero(m, n), c = Matrix::Zero(m, n);
      gemm(1.0, a, op_a, b.cwiseAbs2(), op_b, 0.0, exact);
      {
        const Fp32ProductsOn on(&device);
        gemm_nonnegative(1.0, a, op_a, b, op_b, c, /*square_b=*/true);
      }
      const double rel = double(k + 3) * std::ldexp(1.0, -24) + 1e-15;
      for (int64_t i = 0; i < m; ++i) {
        for (int64_t j = 0; j < n; ++j) {
          ASSERT_LE(std::abs(c(i, j) - exact(i, j)), rel * exact(i, j))
              << "element (" << i << ", " << j << "), op_a " << int(op_a) << " op_b " << int(op_b);
        }
      }
    }
  }
  EXPECT_EQ(device.calls, 4);
}

// A low-rank sum's squares on a device: one product there, within the bound.
TEST(DenseProduct, ALowRankSumOnADeviceKeepsTheBound) {
  const auto [m, n, k] = kDeviceShape;
  const Matrix a = nonnegative(m, k, 34, true, false), b = random_matrix(n, k, 35);
  const Matrix left = random_matrix(n, 4, 36), right = random_matrix(4, k, 37);
  const Matrix sum = b + 0.5 * left * right;
  Matrix exact = Matrix::Zero(m, n), c = Matrix::Zero(m, n);
  gemm(1.0, a, Op::kPlain, sum.cwiseAbs2(), Op::kTransposed, 0.0, exact);
  BlasFp32Device device;
  {
    const Fp32ProductsOn on(&device);
    gemm_nonnegative(1.0, a, Op::kPlain, NonnegativeOperand{b, true, &left, &right, 0.5},
                     Op::kTransposed, c);
  }
  ASSERT_EQ(device.calls, 1);
  const double rel = double(k + 3) * std::ldexp(1.0, -24) + 1e-13;
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      ASSERT_LE(std::abs(c(i, j) - exact(i, j)), rel * exact(i, j))
          << "element (" << i << ", " << j << ")";
    }
  }
}

// A device with staging memory receives its operands there and leaves its result there; the
// floor is the same, bit for bit, as with a device that has none or stages one slot only, and
// with the host's (where it declines), with both operands plain and both transposed.
TEST(DenseProduct, StagedOperandsGiveTheSameBits) {
  const int64_t m = kDeviceShape.m, n = kDeviceShape.n, k = kDeviceShape.k;  // captured below
  for (const Op op_a : {Op::kPlain, Op::kTransposed}) {
    const Op op_b = op_a;  // each operand read in both layouts
    const bool pa = op_a == Op::kPlain, pb = op_b == Op::kPlain;
    const Matrix a = (pa ? random_matrix(m, k, 40) : random_matrix(k, m, 40)).cwiseAbs2();
    const Matrix b = pb ? random_matrix(k, n, 41) : random_matrix(n, k, 41);
    const auto run = [&](bool stages, bool declines, int only_slot = -1) {
      BlasFp32Device device;
      device.stages = stages;
      device.declines = declines;
      device.only_slot = only_slot;
      Matrix c = Matrix::Zero(m, n);
      {
        const Fp32ProductsOn on(&device);
        gemm_nonnegative(1.0, a, op_a, b, op_b, c, /*square_b=*/true);
      }
      EXPECT_EQ(device.calls, 1);
      if (stages && only_slot < 0) {
        const std::vector<const float*> staged = {
            device.buffers[0].data(), device.buffers[1].data(), device.buffers[2].data()};
        EXPECT_EQ(device.seen, staged);
      }
      return c;
    };
    const Matrix plain = run(false, false);
    EXPECT_TRUE(same_bits(plain, run(true, false))) << int(op_a) << " " << int(op_b);
    EXPECT_TRUE(same_bits(plain, run(true, false, 1))) << int(op_a) << " " << int(op_b);
    EXPECT_TRUE(same_bits(run(false, true), run(true, true))) << int(op_a) << " " << int(op_b);
  }
}

// What the device hands back is what C receives: a product 2^-14 high (within the bound at
// k = 2000, so the check passes it) comes out 2^-14 above the host's, element by element.
TEST(DenseProduct, TheDevicesProductIsTheOneUsed) {
  const auto [m, n, k] = kDeviceShape;
  const Matrix a = random_matrix(k, m, 28).cwiseAbs2(), b = random_matrix(n, k, 29).cwiseAbs2();
  Matrix host = Matrix::Zero(m, n), high = Matrix::Zero(m, n);
  gemm_nonnegative(1.0, a, Op::kTransposed, b, Op::kTransposed, host);
  BlasFp32Device device;
  const float factor = 1.0f + std::ldexp(1.0f, -14);
  device.breaks = [factor](auto& c) { c *= factor; };
  {
    const Fp32ProductsOn on(&device);
    gemm_nonnegative(1.0, a, Op::kTransposed, b, Op::kTransposed, high);
  }
  ASSERT_EQ(device.calls, 1);
  // Host and device each within (k + 3) 2^-24 of the exact product, in practice far closer.
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      ASSERT_NEAR(high(i, j) / host(i, j) - 1.0, std::ldexp(1.0, -14), 1e-5)
          << "element (" << i << ", " << j << ")";
    }
  }
}

// A device that declines: the host's product, bit for bit; after the scope, the host's alone.
TEST(DenseProduct, ADeviceThatDeclinesLeavesTheHostsBits) {
  const auto [m, n, k] = kDeviceShape;
  const Matrix a = random_matrix(m, k, 24).cwiseAbs2(), b = random_matrix(k, n, 25).cwiseAbs2();
  Matrix host = Matrix::Zero(m, n), declined = Matrix::Zero(m, n);
  gemm_nonnegative(1.0, a, Op::kPlain, b, Op::kPlain, host);
  BlasFp32Device device;
  device.declines = true;
  {
    const Fp32ProductsOn on(&device);
    gemm_nonnegative(1.0, a, Op::kPlain, b, Op::kPlain, declined);
  }
  EXPECT_EQ(device.calls, 1);
  EXPECT_TRUE(same_bits(host, declined));
  Matrix after = Matrix::Zero(m, n);
  gemm_nonnegative(1.0, a, Op::kPlain, b, Op::kPlain, after);
  EXPECT_EQ(device.calls, 1);
  EXPECT_TRUE(same_bits(host, after));
}

// Wrong products a device could hand back, each caught by the check and named: one element
// doubled, a NaN, an infinity, the last row lost, the result column-major, all off by 0.1%.
TEST(DenseProduct, AWrongDeviceProductIsRefused) {
  const auto [m, n, k] = kDeviceShape;
  const Matrix a = random_matrix(m, k, 26).cwiseAbs2(), b = random_matrix(k, n, 27).cwiseAbs2();
  using Out = Eigen::Map<Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>>;
  const std::vector<std::pair<std::string, std::function<void(Out&)>>> faults = {
      {"one element doubled", [](Out& c) { c(70, 90) *= 2; }},
      {"a NaN", [](Out& c) { c(3, 5) = std::numeric_limits<float>::quiet_NaN(); }},
      {"an infinity", [](Out& c) { c(4, 6) = std::numeric_limits<float>::infinity(); }},
      {"the last row lost", [](Out& c) { c.row(c.rows() - 1).setZero(); }},
      {"column-major",
       [](Out& c) {
         const Eigen::MatrixXf values = c;
         Eigen::Map<Eigen::MatrixXf>(c.data(), c.rows(), c.cols()) = values;
       }},
      {"all 0.1% high", [](Out& c) { c *= 1.001f; }},
  };
  for (const auto& [what, fault] : faults) {
    BlasFp32Device device;
    device.breaks = fault;
    const Fp32ProductsOn on(&device);
    Matrix c = Matrix::Zero(m, n);
    try {
      gemm_nonnegative(1.0, a, Op::kPlain, b, Op::kPlain, c);
      ADD_FAILURE() << what << ": not refused";
    } catch (const std::runtime_error& e) {
      EXPECT_NE(std::string(e.what()).find("on blas-fp32 (m 197, n 263, k 2000)"),
                std::string::npos)
          << what << ": " << e.what();
    }
  }
}

// The check reads each operand in its own layout: in every transpose combination, m, n and k
// distinct, a correct product passes (NonnegativeOnADeviceKeepsTheBound) and each of these is
// refused by the projection that alone sees it. A row 3e-4 high moves that row of C v by 3e-4
// (the bound is (k + 3) 2^-24, 1.2e-4 here) and each column of C^T w by 3e-4 / m; a column
// 3e-4 high, the other way round.
TEST(DenseProduct, AWrongDeviceProductIsRefusedInEveryLayout) {
  const int64_t m = kDeviceShape.m, n = kDeviceShape.n, k = kDeviceShape.k;
  using Out = Eigen::Map<Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>>;
  struct Fault {
    std::string what, caught_by;
    std::function<void(Out&)> breaks;
  };
  const std::vector<Fault> faults = {
      {"the last row 3e-4 high", "c v's row " + std::to_string(m - 1),
       [](Out& c) { c.row(c.rows() - 1) *= 1.0003f; }},
      {"the last column 3e-4 high", "c^T w's column " + std::to_string(n - 1),
       [](Out& c) { c.col(c.cols() - 1) *= 1.0003f; }},
  };
  for (const Op op_a : {Op::kPlain, Op::kTransposed}) {
    for (const Op op_b : {Op::kPlain, Op::kTransposed}) {
      const bool pa = op_a == Op::kPlain, pb = op_b == Op::kPlain;
      const Matrix a = (pa ? random_matrix(m, k, 38) : random_matrix(k, m, 38)).cwiseAbs2();
      const Matrix b = (pb ? random_matrix(k, n, 39) : random_matrix(n, k, 39)).cwiseAbs2();
      for (const auto& fault : faults) {
        BlasFp32Device device;
        device.breaks = fault.breaks;
        const Fp32ProductsOn on(&device);
        Matrix c = Matrix::Zero(m, n);
        const std::string where = fault.what + ", op_a " + std::to_string(int(op_a)) + " op_b " +
                                  std::to_string(int(op_b));
        try {
          gemm_nonnegative(1.0, a, op_a, b, op_b, c);
          ADD_FAILURE() << where << ": not refused";
        } catch (const std::runtime_error& e) {
          EXPECT_NE(std::string(e.what()).find(fault.caught_by), std::string::npos)
              << where << ": " << e.what();
        }
      }
    }
  }
}

TEST(DenseProduct, EmptyInnerDimensionScalesC) {
  const Matrix a(4, 0), b(0, 3);
  Matrix c = Matrix::Constant(4, 3, 2.0);
  gemm(1.0, a, Op::kPlain, b, Op::kPlain, 0.5, c);
  EXPECT_TRUE(c == Matrix::Constant(4, 3, 1.0));
  Matrix d(4, 3);  // uninitialised: beta == 0 must not read it
  gemm(1.0, a, Op::kPlain, b, Op::kPlain, 0.0, d);
  EXPECT_TRUE(d == Matrix::Zero(4, 3));
}

TEST(DenseProduct, RefusesMismatchedShapes) {
  Matrix c(2, 2);
  EXPECT_THROW(gemm(1.0, Matrix(2, 3), Op::kPlain, Matrix(4, 2), Op::kPlain, 0.0, c),
               std::logic_error);
  Matrix wrong(3, 2);
  EXPECT_THROW(gemm(1.0, Matrix(2, 3), Op::kPlain, Matrix(3, 2), Op::kPlain, 0.0, wrong),
               std::logic_error);
}

}  // namespace
}  // namespace gradscope::reference

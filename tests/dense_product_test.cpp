// The reference's tiled products (reference/dense_product.h): each transpose combination
// against a plain triple loop, shapes at the tiles' edges, alpha/beta, and the same bits
// whatever the thread count.
#include "reference/dense_product.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <cstring>
#include <random>

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
  omp_set_num_threads(threads);
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

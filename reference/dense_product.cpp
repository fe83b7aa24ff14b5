#include "reference/dense_product.h"

#include <cblas.h>
#if defined(__SSE__)
#include <pmmintrin.h>
#include <xmmintrin.h>
#endif

#include <cmath>
#include <limits>
#include <mutex>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

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

using FloatRows = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

// An operand's values before squaring, read a block at a time: its own elements, or
// value + scaling L R formed block by block (no weight-sized fp64 copy; a weight-sized one
// cost more in allocation and passes over memory than the low-rank products it holds).
class OperandValues {
 public:
  using Block = Eigen::Map<const Matrix, 0, Eigen::OuterStride<>>;

  explicit OperandValues(const NonnegativeOperand& b) : b_(b) {}
  int64_t rows() const { return b_.value.rows(); }
  int64_t cols() const { return b_.value.cols(); }
  bool squared() const { return b_.squared; }
  // Rows read together: a low-rank term's blocks are products, whose values must not depend on
  // how many rows a thread takes, so their grid is fixed; the value alone is read a row at a
  // time (a short operand still spreads over the threads).
  int64_t block_rows() const { return b_.low_rank_left ? 64 : 1; }
  // Items over the threads: a low-rank term's blocks call the BLAS, whose buffers bound how
  // many threads may call it at once (kMaxCallingThreads); a maximum or a copy is the same
  // whichever thread computes it.
  template <class Body>
  void for_each_item(int64_t items, const Body& body) const {
    if (b_.low_rank_left) {
      for_each_row(items, body, /*dynamic=*/true, kMaxCallingThreads);
    } else {
      for_each_row(items, body);
    }
  }

  // Rows [r0, r0 + nr) and columns [c0, c0 + nc): a view of the value, or `work` holding
  // value + scaling L R there.
  Block block(int64_t r0, int64_t nr, int64_t c0, int64_t nc, Matrix& work) const {
    const double* first = b_.value.data() + r0 * cols() + c0;
    if (!b_.low_rank_left) return Block(first, nr, nc, Eigen::OuterStride<>(cols()));
    work = Block(first, nr, nc, Eigen::OuterStride<>(cols()));
    // One single-threaded call on the calling thread, as gemm's tiles: the block's values then
    // depend on the grid alone (an Eigen product could start threads of its own here).
    const Matrix &left = *b_.low_rank_left, &right = *b_.low_rank_right;
    const blasint rank = dim(left.cols(), "a low-rank term's rank");
    if (rank > 0) {
      scipy_cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<blasint>(nr),
                        static_cast<blasint>(nc), rank, b_.scaling, left.data() + r0 * rank, rank,
                        right.data() + c0, dim(right.cols(), "a row"), 1.0, work.data(),
                        static_cast<blasint>(nc));
    }
    return Block(work.data(), nr, nc, Eigen::OuterStride<>(nc));
  }
  // Element (r, c), squared where the operand is.
  double at(int64_t r, int64_t c) const {
    double v = b_.value(r, c);
    if (b_.low_rank_left) {
      v += b_.scaling * b_.low_rank_left->row(r).dot(b_.low_rank_right->col(c));
    }
    return b_.squared ? v * v : v;
  }
  // The whole operand, squared where it is: for the fp64 path of a non-finite operand.
  Matrix whole() const {
    Matrix out(rows(), cols());
    for_each_item(rows(), [&](int64_t r) {
      Matrix work;
      out.row(r) = block(r, 1, 0, cols(), work);
      if (b_.squared) out.row(r) = out.row(r).cwiseAbs2();
    });
    return out;
  }

 private:
  const NonnegativeOperand b_;
};

// Columns of an operand read together.
constexpr int64_t kBlockCols = 256;

// The power-of-two scales of a nonnegative operand's rows or columns (`along_rows`: one per
// row, else one per column): exponent e with max * 2^-e in [1, 2), or `zero` set where the
// row or column is all zero. A maximum below fp64's normal range takes the exponent of its
// bottom, -1022, so that 2^-e stays finite: max * 2^-e is then below 1, and any nonzero
// element at least 2^-52, which fp32 holds. False if an element is not finite.
struct Scales {
  std::vector<int> exponent;
  std::vector<double> factor;  // 2^-exponent
  std::vector<char> zero;
};
bool scales_of(const OperandValues& x, bool along_rows, Scales& out) {
  const bool squared = x.squared();
  const int64_t rows = x.rows(), cols = x.cols(), lines = along_rows ? rows : cols;
  Eigen::VectorXd largest = Eigen::VectorXd::Zero(lines);
  // Blocks of rows, each scanning every column, or blocks of columns, each scanning every row:
  // a maximum does not depend on the order.
  const int64_t block_rows = x.block_rows();
  const int64_t items =
      along_rows ? (rows + block_rows - 1) / block_rows : (cols + kBlockCols - 1) / kBlockCols;
  std::vector<char> item_finite(static_cast<size_t>(items), 1);
  x.for_each_item(items, [&](int64_t item) {
    Matrix work;
    bool all_finite = true;
    const auto visit = [&](int64_t r0, int64_t nr, int64_t c0, int64_t nc) {
      const auto b = x.block(r0, nr, c0, nc, work);
      all_finite = all_finite && b.allFinite();
      auto rows_of = largest.segment(along_rows ? r0 : 0, along_rows ? nr : 0);
      auto cols_of = largest.segment(along_rows ? 0 : c0, along_rows ? 0 : nc).transpose();
      if (along_rows && squared) {
        rows_of = rows_of.cwiseMax(b.cwiseAbs().rowwise().maxCoeff());
      } else if (along_rows) {
        rows_of = rows_of.cwiseMax(b.rowwise().maxCoeff());
      } else if (squared) {
        cols_of = cols_of.cwiseMax(b.cwiseAbs().colwise().maxCoeff());
      } else {
        cols_of = cols_of.cwiseMax(b.colwise().maxCoeff());
      }
    };
    if (along_rows) {
      const int64_t r0 = item * block_rows, nr = std::min(block_rows, rows - r0);
      for (int64_t c0 = 0; c0 < cols; c0 += kBlockCols) {
        visit(r0, nr, c0, std::min(kBlockCols, cols - c0));
      }
    } else {
      const int64_t c0 = item * kBlockCols, nc = std::min(kBlockCols, cols - c0);
      for (int64_t r0 = 0; r0 < rows; r0 += block_rows) {
        visit(r0, std::min(block_rows, rows - r0), c0, nc);
      }
    }
    item_finite[item] = all_finite;
  });
  for (const char f : item_finite) {
    if (!f) return false;
  }
  if (squared) {
    largest = largest.cwiseAbs2();
    if (!largest.allFinite()) return false;  // a square overflows
  }
  out.exponent.assign(static_cast<size_t>(lines), 0);
  out.zero.assign(static_cast<size_t>(lines), 0);
  out.factor.assign(static_cast<size_t>(lines), 1.0);
  for (int64_t l = 0; l < lines; ++l) {
    if (largest(l) > 0) {
      out.exponent[l] =
          std::max(std::ilogb(largest(l)), std::numeric_limits<double>::min_exponent - 1);
      out.factor[l] = std::ldexp(1.0, -out.exponent[l]);
    } else {
      out.zero[l] = 1;
    }
  }
  return true;
}

// x's elements (squared where it is) as floats, each multiplied by 2^-exponent of its row
// (`along_rows`) or column (a power of two: exact, but where the product is subnormal); same
// layout as x, written into `out` [rows, cols]. Each block of rows is written by the thread
// that converts it, into storage left uninitialised: zeroing a weight-sized array first, on one
// thread, took longer than the conversion itself.
void scaled_floats(const OperandValues& x, bool along_rows, const Scales& s, float* out) {
  const int64_t rows = x.rows(), cols = x.cols();
  const int64_t block_rows = x.block_rows();
  x.for_each_item((rows + block_rows - 1) / block_rows, [&](int64_t item) {
    Matrix work;
    const int64_t r0 = item * block_rows, nr = std::min(block_rows, rows - r0);
    for (int64_t c0 = 0; c0 < cols; c0 += kBlockCols) {
      const int64_t nc = std::min(kBlockCols, cols - c0);
      const auto b = x.block(r0, nr, c0, nc, work);
      const Eigen::Map<const Eigen::ArrayXd> column_factor(
          along_rows ? s.factor.data() : s.factor.data() + c0, along_rows ? 0 : nc);
      for (int64_t r = 0; r < nr; ++r) {
        auto dst = Eigen::Map<Eigen::ArrayXf>(out + (r0 + r) * cols + c0, nc);
        const auto src = b.row(r).transpose().array();
        if (along_rows && x.squared()) {
          dst = (src.square() * s.factor[r0 + r]).cast<float>();
        } else if (along_rows) {
          dst = (src * s.factor[r0 + r]).cast<float>();
        } else if (x.squared()) {
          dst = (src.square() * column_factor).cast<float>();
        } else {
          dst = (src * column_factor).cast<float>();
        }
      }
    }
  });
}

// Room for `count` floats: the device's staging memory where it has some, else `own`'s.
float* floats_for(Fp32Device* device, int slot, int64_t count, FloatRows& own) {
  if (float* p = device ? device->staging(slot, count) : nullptr) return p;
  own.resize(count, 1);
  return own.data();
}

// For its lifetime, the calling thread's SSE/AVX arithmetic treats subnormal fp32 inputs and
// results as zero (FTZ and DAZ), then the thread's previous mode is restored. A product of two
// elements small for their row's and column's scales is subnormal in fp32, and each one costs
// the FMA units a microcode assist, several times the cost of the product itself with outlier
// channels (docs/performance.md). Flushing loses at most k 2^-125 of an element in the scales'
// units, 2^-26 of any element not computed again in fp64 (docs/verification.md).
class FlushSubnormals {
 public:
#if defined(__SSE__)
  FlushSubnormals() : csr_(_mm_getcsr()) {
    _mm_setcsr(csr_ | _MM_FLUSH_ZERO_ON | _MM_DENORMALS_ZERO_ON);
  }
  ~FlushSubnormals() {
    _mm_setcsr(csr_);
  }

 private:
  unsigned csr_;
#endif
};

// The shapes of C = op(A) op(B): op(A) [m, k], op(B) [k, n]; throws where they or C's disagree.
struct ProductShape {
  bool ta, tb;
  int64_t m, n, k;
  ProductShape(const Matrix& a, Op op_a, const Matrix& b, Op op_b, const Matrix& c)
      : ta(op_a == Op::kTransposed),
        tb(op_b == Op::kTransposed),
        m(ta ? a.cols() : a.rows()),
        n(tb ? b.rows() : b.cols()),
        k(ta ? a.rows() : a.cols()) {
    const int64_t kb = tb ? b.cols() : b.rows();
    if (k != kb || c.rows() != m || c.cols() != n) {
      throw std::logic_error("reference product: shapes do not match");
    }
  }
};

// C's grid of `tile`s, fixed by its shape alone, handed to the threads one at a time:
// body(first row, first column, rows, columns) for each.
template <class Body>
void for_each_tile(int64_t m, int64_t n, TileShape tile, const Body& body) {
  const int64_t row_tiles = (m + tile.rows - 1) / tile.rows;
  const int64_t col_tiles = (n + tile.cols - 1) / tile.cols;
  for_each_row(
      row_tiles * col_tiles,
      [&](int64_t t) {
        const int64_t i = t / col_tiles * tile.rows, j = t % col_tiles * tile.cols;
        body(i, j, static_cast<blasint>(std::min(tile.rows, m - i)),
             static_cast<blasint>(std::min(tile.cols, n - j)));
      },
      /*dynamic=*/true, kMaxCallingThreads);
}

}  // namespace

void gemm(double alpha, const Matrix& a, Op op_a, const Matrix& b, Op op_b, double beta,
          Matrix& c) {
  const ProductShape s(a, op_a, b, op_b, c);
  const bool ta = s.ta, tb = s.tb;
  const int64_t m = s.m, n = s.n, k = s.k;
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
  for_each_tile(m, n, kProductTile, [&](int64_t i, int64_t j, blasint mt, blasint nt) {
    // Row-major: op(A)'s rows i.. start at row i of A, or at column i of a transposed A;
    // op(B)'s columns j.. at column j of B, or at row j of a transposed B.
    const double* pa = ta ? a.data() + i : a.data() + i * a.cols();
    const double* pb = tb ? b.data() + j * b.cols() : b.data() + j;
    scipy_cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
                      mt, nt, kk, alpha, pa, lda, pb, ldb, beta, c.data() + i * c.cols() + j, ldc);
  });
}

namespace {

thread_local Fp32Device* t_fp32_device = nullptr;

// x right and x^T left for x row-major [rows, cols] of floats, in fp64, in one pass over x (an
// empty vector skips its side). x is read in tiles of kTileRows x kTileCols; each result element
// sums its tiles' partial sums in a fixed order, so the values do not depend on the threads.
struct BothWays {
  Eigen::VectorXd right;  // x right [rows]
  Eigen::VectorXd left;   // x^T left [cols]
};
BothWays both_ways(const float* x, int64_t rows, int64_t cols, const Eigen::VectorXd& right,
                   const Eigen::VectorXd& left) {
  constexpr int64_t kTileRows = 512, kTileCols = 256;
  using Segment = Eigen::Map<const Eigen::VectorXf>;
  const int64_t row_tiles = (rows + kTileRows - 1) / kTileRows;
  const int64_t col_tiles = (cols + kTileCols - 1) / kTileCols;
  const bool with_right = right.size() > 0, with_left = left.size() > 0;
  // right_parts(r, tile column), left_parts(tile row, c).
  Matrix right_parts = Matrix::Zero(with_right ? rows : 0, col_tiles);
  Matrix left_parts = Matrix::Zero(with_left ? row_tiles : 0, cols);
  for_each_row(row_tiles * col_tiles, [&](int64_t t) {
    const int64_t tr = t / col_tiles, tc = t % col_tiles;
    const int64_t r0 = tr * kTileRows, r1 = std::min(rows, r0 + kTileRows);
    const int64_t c0 = tc * kTileCols, width = std::min(kTileCols, cols - c0);
    Eigen::VectorXd sum = Eigen::VectorXd::Zero(with_left ? width : 0);
    for (int64_t r = r0; r < r1; ++r) {
      const auto seg = Segment(x + r * cols + c0, width).cast<double>();
      if (with_right) right_parts(r, tc) = seg.dot(right.segment(c0, width));
      if (with_left) sum += left(r) * seg;
    }
    if (with_left) left_parts.row(tr).segment(c0, width) = sum.transpose();
  });
  BothWays out;
  if (with_right) out.right = right_parts.rowwise().sum();
  if (with_left) out.left = left_parts.colwise().sum().transpose();
  return out;
}

// Checks a device's c = op(A) op(B) of nonnegative floats against the operands, in fp64 from the
// same floats (docs/verification.md, "The floor's products on the GPU"): Freivalds' two
// projections, c v against op(A) (op(B) v) and c^T w against op(B)^T (op(A)^T w), with v and w
// drawn from a fixed seed, and kSampled elements against their definition. A sum of nonnegative
// fp32 terms, in any order, is within (k + 3) 2^-24 of its exact value, flushed terms included
// (each below 2^-125 in the scales' units), and so is any positive combination of such sums.
void check_device_product(const Fp32Product& p, const float* c, const std::string& device) {
  constexpr int kSampled = 64;
  const int64_t m = p.m, n = p.n, k = p.k;
  const double rel = (double(k) + 3) * std::ldexp(1.0, -24) + std::ldexp(1.0, -40);
  const double flushed = double(k) * std::ldexp(1.0, -124);  // an element's, in absolute terms
  std::mt19937_64 gen(0x9e3779b97f4a7c15ULL);
  std::uniform_real_distribution<double> positive(1.0, 2.0);
  Eigen::VectorXd v(n), w(m);
  for (auto& x : v) x = positive(gen);
  for (auto& x : w) x = positive(gen);
  const auto fail = [&](const std::string& what, int64_t index, double got, double exact) {
    throw std::runtime_error("the floor's fp32 product on " + device + " (m " + std::to_string(m) +
                             ", n " + std::to_string(n) + ", k " + std::to_string(k) +
                             ") disagrees with its operands: " + what + " " +
                             std::to_string(index) + " is " + std::to_string(got) +
                             ", the operands give " + std::to_string(exact));
  };
  // A NaN or an infinity fails (the operands are finite, and so is their exact product).
  const auto within = [&](double got, double exact, double weight) {
    return std::isfinite(got) &&
           std::abs(got - exact) <= rel * std::max(got, exact) + flushed * weight;
  };
  // op(A) [m, k] is A [m, k] or A^T with A [k, m]; op(B) likewise. Each of B and C is read
  // once, for both projections: op(A)^T w first, then op(B) v and op(B)^T (op(A)^T w) in one
  // pass over B, then op(A) (op(B) v).
  const Eigen::VectorXd none;
  const auto a_times = [&](const Eigen::VectorXd& x, bool transposed) {  // op(A) x or op(A)^T x
    const bool left = transposed != p.ta;                                // a pass as A^T
    const auto r = p.ta ? both_ways(p.a, k, m, left ? none : x, left ? x : none)
                        : both_ways(p.a, m, k, left ? none : x, left ? x : none);
    return left ? r.left : r.right;
  };
  const Eigen::VectorXd atw = a_times(w, true);
  // op(B) v and op(B)^T atw: B v and B^T atw, or with B [n, k] stored, B^T v and B atw.
  const BothWays b = p.tb ? both_ways(p.b, n, k, atw, v) : both_ways(p.b, k, n, v, atw);
  const Eigen::VectorXd &bv = p.tb ? b.left : b.right, &baw = p.tb ? b.right : b.left;
  const Eigen::VectorXd abv = a_times(bv, false);
  const BothWays cvw = both_ways(c, m, n, v, w);
  for (int64_t i = 0; i < m; ++i) {
    if (!within(cvw.right(i), abv(i), v.sum())) fail("c v's row", i, cvw.right(i), abv(i));
  }
  for (int64_t j = 0; j < n; ++j) {
    if (!within(cvw.left(j), baw(j), w.sum())) fail("c^T w's column", j, cvw.left(j), baw(j));
  }
  std::uniform_int_distribution<int64_t> row(0, m - 1), col(0, n - 1);
  for (int s = 0; s < kSampled; ++s) {
    const int64_t i = row(gen), j = col(gen);
    double exact = 0;
    for (int64_t q = 0; q < k; ++q) {
      const double aq = p.ta ? p.a[q * m + i] : p.a[i * k + q];
      exact += aq * (p.tb ? p.b[j * k + q] : p.b[q * n + j]);
    }
    const double got = c[i * n + j];
    if (!within(got, exact, 1.0)) fail("element", i * n + j, got, exact);
  }
}

}  // namespace

Fp32ProductsOn::Fp32ProductsOn(Fp32Device* device) : previous_(t_fp32_device) {
  t_fp32_device = device;
}

Fp32ProductsOn::~Fp32ProductsOn() {
  t_fp32_device = previous_;
}

bool worth_a_device(int64_t m, int64_t n, int64_t k) {
  const double dm = double(m), dn = double(n), dk = double(k);
  return dm * dn * dk >= kDeviceMinIntensity * (dm * dk + dk * dn + dm * dn);
}

void gemm_nonnegative(double alpha, const Matrix& a, Op op_a, const NonnegativeOperand& b_in,
                      Op op_b, Matrix& c) {
  const Matrix& b = b_in.value;
  const bool low_rank = b_in.low_rank_left || b_in.low_rank_right;
  if (low_rank &&
      (!b_in.squared || !b_in.low_rank_left || !b_in.low_rank_right ||
       b_in.low_rank_left->rows() != b.rows() || b_in.low_rank_right->cols() != b.cols() ||
       b_in.low_rank_left->cols() != b_in.low_rank_right->rows())) {
    throw std::logic_error("gemm_nonnegative: a low-rank term needs a squared operand and L " +
                           std::string("[rows, r], R [r, cols]"));
  }
  const ProductShape s(a, op_a, b, op_b, c);
  const bool ta = s.ta, tb = s.tb;
  const int64_t m = s.m, n = s.n, k = s.k;
  if (m == 0 || n == 0 || k == 0) return;
  single_threaded_blas();  // a low-rank term's blocks are BLAS calls too
  const OperandValues va(NonnegativeOperand{a}), vb(b_in);
  // op(A)'s rows are A's rows, or its columns when transposed; op(B)'s columns likewise.
  Scales sa, sb;
  if (!scales_of(va, !ta, sa) || !scales_of(vb, tb, sb)) {
    gemm(alpha, a, op_a, b_in.squared ? vb.whole() : b, op_b, 1.0, c);
    return;
  }
  Fp32Device* device = omp_get_level() == 0 ? t_fp32_device : nullptr;
  if (device && !device->takes(m, n, k)) device = nullptr;
  FloatRows own_a, own_b, own_c;
  float* const fa = floats_for(device, 0, m * k, own_a);
  float* const fb = floats_for(device, 1, k * n, own_b);
  scaled_floats(va, !ta, sa, fa);
  scaled_floats(vb, tb, sb, fb);
  const blasint lda = dim(a.cols(), "a row"), ldb = dim(b.cols(), "a row");
  const blasint kk = dim(k, "an inner dimension");
  // Below this (in the scales' units) the terms fp32 flushed may matter: fp64 again.
  const double small = std::ldexp(static_cast<double>(k), -99);
  // Adds alpha times the fp32 block t (rows i.., columns j..; row stride ldt) to c.
  const auto add_block = [&](const float* t, int64_t ldt, int64_t i, int64_t j, int64_t mt,
                             int64_t nt) {
    for (int64_t r = 0; r < mt; ++r) {
      const int64_t row = i + r;
      if (sa.zero[row]) continue;
      for (int64_t q = 0; q < nt; ++q) {
        const int64_t col = j + q;
        if (sb.zero[col]) continue;
        const double v = t[r * ldt + q];
        if (v >= small) {
          c(row, col) += alpha * std::ldexp(v, sa.exponent[row] + sb.exponent[col]);
          continue;
        }
        double exact = 0;
        for (int64_t p = 0; p < k; ++p) {
          exact += (ta ? a(p, row) : a(row, p)) * (tb ? vb.at(col, p) : vb.at(p, col));
        }
        c(row, col) += alpha * exact;
      }
    }
  };
  if (device) {
    const Fp32Product p{fa, ta, fb, tb, m, n, k};
    float* const whole = floats_for(device, 2, m * n, own_c);
    if (device->multiply(p, whole)) {
      check_device_product(p, whole, device->name());
      for_each_row(m, [&](int64_t r) { add_block(whole + r * n, n, r, 0, 1, n); });
      return;
    }
  }
  for_each_tile(m, n, nonnegative_tiles(m, n), [&](int64_t i, int64_t j, blasint mt, blasint nt) {
    const float* pa = ta ? fa + i : fa + i * a.cols();
    const float* pb = tb ? fb + j * b.cols() : fb + j;
    FloatRows tile(mt, nt);
    {
      const FlushSubnormals flush;
      scipy_cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans,
                        tb ? CblasTrans : CblasNoTrans, mt, nt, kk, 1.0f, pa, lda, pb, ldb, 0.0f,
                        tile.data(), nt);
    }
    add_block(tile.data(), nt, i, j, mt, nt);
  });
}

TileShape nonnegative_tiles(int64_t m, int64_t n) {
  for (const int64_t rows : {int64_t{768}, int64_t{384}}) {
    if (((m + rows - 1) / rows) * ((n + kNonnegativeTileCols - 1) / kNonnegativeTileCols) >=
        kNonnegativeMinTiles) {
      return {rows, kNonnegativeTileCols};
    }
  }
  return {kProductTile.rows, kNonnegativeTileCols};
}

Matrix product(const Matrix& a, Op op_a, const Matrix& b, Op op_b, double alpha) {
  Matrix c(op_a == Op::kTransposed ? a.cols() : a.rows(),
           op_b == Op::kTransposed ? b.rows() : b.cols());
  gemm(alpha, a, op_a, b, op_b, 0.0, c);
  return c;
}

}  // namespace gradscope::reference

// The reference's large fp64 matrix products, C = alpha op(A) op(B) + beta C, at the speed of a
// tuned BLAS and with values that do not depend on the thread count (docs/verification.md,
// "The reference's products").
//
// C is cut into a grid of tiles fixed by C's shape alone; each tile is one single-threaded DGEMM
// (OpenBLAS) over the whole inner dimension, and the tiles are handed to the OpenMP threads one
// at a time as each finishes the last (a static split runs well below a tuned BLAS's speed).
// Every element is therefore computed by the same call on the same operands whatever the
// thread count or the schedule: threads change the speed, never a value. Inside another
// parallel region (attention's heads) the tiles run on the calling thread.
#pragma once

#include <string>

#include "reference/gptq_reference.h"

namespace gradscope::reference {

enum class Op { kPlain, kTransposed };

// C = alpha op(A) op(B) + beta C. C must already have the product's shape and must not share
// memory with A or B; with beta == 0 its values are not read (they may be uninitialised).
void gemm(double alpha, const Matrix& a, Op op_a, const Matrix& b, Op op_b, double beta, Matrix& c);

// C += alpha op(A) op(B) for operands with no negative element (squares, variances: the
// floor's products of squares), alpha >= 0, computed in fp32 at twice the fp64 rate
// (docs/verification.md, "The reference's products"). Each row of op(A) and each column of
// op(B) is scaled by a power of two that brings its largest element into [1, 2) (exact; one
// whose largest element is below fp64's normal range by 2^1022, into [2^-52, 1)), so no
// operand overflows or underflows for its scale; each element's relative error is then at most
// about (K + 3) 2^-24 (a sum of K nonnegative terms, its terms subnormal in fp32 flushed to
// zero: they would run the FMA units through microcode). Where a computed element is small for its
// row's and column's scales (below K 2^-99: terms the fp32 range flushed may matter there) it is
// computed again in fp64 from the operands, and operands with a non-finite element are
// multiplied in fp64 throughout. Values do not depend on the thread count (the tiles of gemm).
// On a thread lent a device (Fp32ProductsOn), a product worth it is computed there instead, and
// checked on the host before it is used.
//
// B is given as a NonnegativeOperand: its elements as stored, their squares, or the squares of
// B + scaling L R (a weight and its adapter's low-rank term). The squares, and B + scaling L R,
// are formed a block at a time where the product reads them, never as a whole fp64 matrix.
struct NonnegativeOperand {
  const Matrix& value;
  bool squared = false;
  // Only with `squared`: L [value.rows(), r] and R [r, value.cols()], or both null.
  const Matrix* low_rank_left = nullptr;
  const Matrix* low_rank_right = nullptr;
  double scaling = 0;
};
void gemm_nonnegative(double alpha, const Matrix& a, Op op_a, const NonnegativeOperand& b, Op op_b,
                      Matrix& c);
// `square_b`: op(B)'s elements squared.
inline void gemm_nonnegative(double alpha, const Matrix& a, Op op_a, const Matrix& b, Op op_b,
                             Matrix& c, bool square_b = false) {
  gemm_nonnegative(alpha, a, op_a, NonnegativeOperand{b, square_b}, op_b, c);
}

// An fp32 product of gemm_nonnegative's scaled operands, as handed to another device: op(A)
// [m, k] times op(B) [k, n]; A is row-major [m, k], or [k, m] where ta, and B likewise.
struct Fp32Product {
  const float* a;
  bool ta;
  const float* b;
  bool tb;
  int64_t m, n, k;
};

// Whether a product of these shapes is worth a device: the operands and the result cross to it
// and back once (m k + k n + m n elements) against m n k multiply-adds, so small or thin
// products are faster on the host. Shapes alone decide.
inline constexpr double kDeviceMinIntensity = 512;
bool worth_a_device(int64_t m, int64_t n, int64_t k);

// A device that computes gemm_nonnegative's fp32 products in place of this host's BLAS: the
// harness offers a case's GPU (docs/verification.md, "The floor's products on the GPU").
class Fp32Device {
 public:
  virtual ~Fp32Device() = default;
  virtual std::string name() const = 0;
  // Whether gemm_nonnegative offers it a product of these shapes (else the host computes it): a
  // function of the shapes alone, so that a case's products go to the device or stay on the
  // host the same way in every run.
  virtual bool takes(int64_t m, int64_t n, int64_t k) const { return worth_a_device(m, n, k); }
  // c [m, n], row-major = op(A) op(B), each element a sum of fp32 products accumulated in fp32.
  // False: the device declines (its products would round the operands, as TF32 does) and the
  // host computes it.
  virtual bool multiply(const Fp32Product& p, float* c) = 0;
  // Host memory for `count` floats that the device copies from and to fastest (page-locked for
  // a GPU), or nullptr: the product's operands are converted straight into it, and its result
  // lands in it. One buffer per slot (0: A, 1: B, 2: C), valid until the next call for that slot.
  virtual float* staging(int slot, int64_t count) {
    (void)slot, (void)count;
    return nullptr;
  }
};

// For its lifetime, gemm_nonnegative on the calling thread hands each product the device takes
// (by default those worth their transfers) to `device` and checks the result against the
// operands: a wrong one throws std::runtime_error naming the device and the shape. nullptr: the
// host's BLAS.
// Products inside another parallel region, and on other threads, stay on the host.
class Fp32ProductsOn {
 public:
  explicit Fp32ProductsOn(Fp32Device* device);
  ~Fp32ProductsOn();
  Fp32ProductsOn(const Fp32ProductsOn&) = delete;
  Fp32ProductsOn& operator=(const Fp32ProductsOn&) = delete;

 private:
  Fp32Device* previous_;
};

// alpha op(A) op(B), a new matrix.
Matrix product(const Matrix& a, Op op_a, const Matrix& b, Op op_b, double alpha = 1.0);
inline Matrix product(const Matrix& a, const Matrix& b) {
  return product(a, Op::kPlain, b, Op::kPlain);
}

// One tile of C's grid, rows x columns (exposed for the tests at the tiles' edges).
struct TileShape {
  int64_t rows, cols;
};
// gemm's tiles.
inline constexpr TileShape kProductTile{192, 768};
inline constexpr int64_t kTileRows = kProductTile.rows;
inline constexpr int64_t kTileCols = kProductTile.cols;
// gemm_nonnegative's tiles, also fixed by C's shape alone: 768 or 384 rows where that still
// leaves at least kNonnegativeMinTiles tiles to share among the threads, else gemm's 192. Each
// tile's call packs its columns of op(B) again, and fp32's kernel, twice as fast, makes that
// copy weigh twice as much as in fp64: taller tiles copy op(B) fewer times
// (docs/performance.md, "The reference's products").
inline constexpr int64_t kNonnegativeTileCols = 384;
inline constexpr int64_t kNonnegativeMinTiles = 64;
TileShape nonnegative_tiles(int64_t m, int64_t n);

}  // namespace gradscope::reference

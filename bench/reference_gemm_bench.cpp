// The fp64 reference's products against the tuned BLAS on the same host, in one run: for each
// shape, GFLOP/s (2 m n k / t, best of --repeat after one warm-up) of
//   - the tuned BLAS: torch's CPU matmul in float64 (MKL's DGEMM in the PyPI wheel), on
//     torch's threads;
//   - reference::gemm (reference/dense_product.h: OpenBLAS per tile, tiles over OpenMP);
//   - Eigen's own product, as the reference computed it before (C.noalias() = A * B, Eigen's
//     OpenMP GEMM),
// and each one's ratio to the tuned BLAS; then the floor's products of nonnegative operands
// (reference::gemm_nonnegative: fp32 per tile, after each row and column is scaled) against
// the tuned BLAS's SGEMM (torch's float32 matmul), on the absolute values of the same operands
// (docs/performance.md, "The reference's products").
//   gradscope_reference_gemm_bench [--shape MxNxK]... [--repeat N]
#include <ATen/Parallel.h>
#include <ATen/ops/abs.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/mm.h>
#include <malloc.h>
#include <omp.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <climits>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "eigen_product.h"
#include "reference/dense_product.h"

namespace {

using gradscope::reference::Matrix;
using gradscope::reference::Op;

double best_seconds(int repeat, const std::function<void()>& run) {
  run();  // warm-up: first-touch pages, thread pools
  double best = 1e300;
  for (int r = 0; r < repeat; ++r) {
    const auto start = std::chrono::steady_clock::now();
    run();
    best = std::min(
        best, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  // The heap gradscope runs with (harness/cli/main.cpp): freed memory serves the next product's
  // operands, so no run pays for page faults the gradscope process does not.
  mallopt(M_ARENA_MAX, 1);
  mallopt(M_MMAP_MAX, 0);
  mallopt(M_TRIM_THRESHOLD, INT_MAX);
  CLI::App app{"fp64 GEMM: the reference's products against the tuned BLAS on this host"};
  std::vector<std::string> shapes{"4096x4096x4096", "2048x28672x8192", "2048x8192x28672"};
  int repeat = 3;
  app.add_option("--shape", shapes, "MxNxK (repeatable); default: a cube and the 70B MLP's two");
  app.add_option("--repeat", repeat, "timed runs per product after a warm-up")
      ->check(CLI::Range(1, 100));
  CLI11_PARSE(app, argc, argv);

  struct Shape {
    long long m, n, k;
  };
  std::vector<Shape> parsed;
  for (const auto& shape : shapes) {
    Shape p{};
    if (std::sscanf(shape.c_str(), "%lldx%lldx%lld", &p.m, &p.n, &p.k) != 3 || p.m < 1 || p.n < 1 ||
        p.k < 1) {
      std::fprintf(stderr, "--shape %s: expected MxNxK with positive integers\n", shape.c_str());
      return 2;
    }
    parsed.push_back(p);
  }
  std::printf("threads: torch %d, OpenMP %d\n", at::get_num_threads(), omp_get_max_threads());
  std::printf("%-18s %12s %12s %7s %12s %7s %12s %12s %7s\n", "m x n x k", "BLAS GFLOP/s",
              "reference", "ratio", "Eigen", "ratio", "SGEMM", "nonnegative", "ratio");
  for (const auto& [m, n, k] : parsed) {
    const Matrix a = Matrix::Random(m, k), b = Matrix::Random(k, n);
    Matrix c(m, n);
    const auto ta = at::from_blob(const_cast<double*>(a.data()), {m, k}, at::kDouble);
    const auto tb = at::from_blob(const_cast<double*>(b.data()), {k, n}, at::kDouble);
    const double blas = best_seconds(repeat, [&] { at::mm(ta, tb); });
    const double ref = best_seconds(
        repeat, [&] { gradscope::reference::gemm(1.0, a, Op::kPlain, b, Op::kPlain, 0.0, c); });
    const double eigen = best_seconds(repeat, [&] { gradscope::bench::eigen_product(a, b, c); });
    const Matrix a_abs = a.cwiseAbs(), b_abs = b.cwiseAbs();
    const auto ta32 = ta.abs().to(at::kFloat), tb32 = tb.abs().to(at::kFloat);
    const double sgemm = best_seconds(repeat, [&] { at::mm(ta32, tb32); });
    const double nonnegative = best_seconds(repeat, [&] {
      c.setZero();
      gradscope::reference::gemm_nonnegative(1.0, a_abs, Op::kPlain, b_abs, Op::kPlain, c);
    });
    const double gflop = 2.0 * double(m) * double(n) * double(k) / 1e9;
    const std::string shape = std::to_string(m) + "x" + std::to_string(n) + "x" + std::to_string(k);
    std::printf("%-18s %12.1f %12.1f %7.2f %12.1f %7.2f %12.1f %12.1f %7.2f\n", shape.c_str(),
                gflop / blas, gflop / ref, blas / ref, gflop / eigen, blas / eigen, gflop / sgemm,
                gflop / nonnegative, sgemm / nonnegative);
  }
  return 0;
}

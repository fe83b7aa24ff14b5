// fp64 reference for the GPTQ format, written from docs/gptq-format.md.
// It is the judge: plain integer arrays and Eigen, no torch, no kernels/ code.
#pragma once

#include <Eigen/Core>

#include <cstdint>
#include <vector>

namespace gradscope::reference {

using Matrix = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using IntMatrix = Eigen::Matrix<int64_t, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

// One quantized linear layer as stored in a checkpoint, every array row-major.
struct GptqLayer {
  int bits = 4;
  bool v1_zero_minus_one = true;  // checkpoint_format "gptq" stores zero - 1
  int64_t in_features = 0;        // K
  int64_t out_features = 0;       // N
  int64_t groups = 0;             // G
  std::vector<uint32_t> qweight;  // [K * bits / 32, N]
  std::vector<uint32_t> qzeros;   // [G, N * bits / 32]
  std::vector<double> scales;     // [G, N], the stored half-precision values
  std::vector<int32_t> g_idx;     // [K]
};

// Throws std::invalid_argument if the arrays do not have the sizes the spec implies.
void check_layer(const GptqLayer& layer);

// code(k, n) for every k, n: [K, N].
IntMatrix decode_codes(const GptqLayer& layer);
// Effective zero point of every group and column: [G, N] (v1: stored field + 1).
IntMatrix decode_zeros(const GptqLayer& layer);
// W^T[k, n] = scales[g_idx[k], n] * (code(k, n) - zero(g_idx[k], n)), in fp64: [K, N].
Matrix dequantize(const GptqLayer& layer);

}  // namespace gradscope::reference

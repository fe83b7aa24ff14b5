// CUDA kernels of the LoRA adapter path in fp32 beside fp16 or bf16 activations (peft's mixed
// precision: fp32 adapters, half activations). Through ATen this path cast every block of x
// and dY to fp32, ran fp32 GEMMs of rank r, wrote the adapter term as an fp32 [tokens,
// features] tensor and added it in a second pass: about five times the bytes of x moved per
// use. Each kernel here reads the half tensor once and does the fp32 arithmetic in registers.
// Rank <= 32 is 64 FLOP or less per element, so each could run at the speed of its memory
// traffic; where each stands and what bounds it: docs/performance.md.
// Every sum over tokens or features is split in a fixed way and reduced in a fixed order, so
// results are the same from run to run.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <type_traits>

#include "lora_adapter_cuda_launch.h"

namespace gradscope::cuda {
namespace {

__device__ __forceinline__ float to_float(__half v) {
  return __half2float(v);
}
__device__ __forceinline__ float to_float(__nv_bfloat16 v) {
  return __bfloat162float(v);
}
template <typename T>
__device__ __forceinline__ T from_float(float v);
template <>
__device__ __forceinline__ __half from_float<__half>(float v) {
  return __float2half_rn(v);
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

// The unsigned type of kBytes bytes: N two-byte or one-byte elements as one vector access.
template <int kBytes>
using Raw = std::conditional_t<
    kBytes == 16, uint4,
    std::conditional_t<kBytes == 8, uint2,
                       std::conditional_t<kBytes == 4, uint32_t,
                                          std::conditional_t<kBytes == 2, uint16_t, uint8_t>>>>;

template <typename T, int N>
__device__ __forceinline__ void load_values(const T* p, float (&v)[N]) {
  using R = Raw<N * sizeof(T)>;
  const R raw = *reinterpret_cast<const R*>(p);
  const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
  for (int i = 0; i < N; ++i) v[i] = to_float(e[i]);
}

template <typename T, int N>
__device__ __forceinline__ void store_values(T* p, const float (&v)[N]) {
  using R = Raw<N * sizeof(T)>;
  R raw;
  T* e = reinterpret_cast<T*>(&raw);
#pragma unroll
  for (int i = 0; i < N; ++i) e[i] = from_float<T>(v[i]);
  *reinterpret_cast<R*>(p) = raw;
}

// v[i] *= mask[i] ? keep_scale : 0, the product rounded once in fp32 (x * mask is exact).
template <int N>
__device__ __forceinline__ void apply_mask(const uint8_t* mask, float keep_scale, float (&v)[N]) {
  using R = Raw<N>;
  const R raw = *reinterpret_cast<const R*>(mask);
  const uint8_t* m = reinterpret_cast<const uint8_t*>(&raw);
#pragma unroll
  for (int i = 0; i < N; ++i) v[i] = m[i] ? v[i] * keep_scale : 0.0f;
}

// ---- P = alpha * x W^T ------------------------------------------------------------------
// A thread owns kRowsTokens tokens: it sums their rows against a [kRowsStep, rank] tile of W
// in shared memory that every thread of the block reads at the same address (a broadcast), so
// each shared load feeds kRowsTokens FMAs per rank (with one token per thread these loads
// bound the kernel). The next step's x and W are loaded while this
// step is summed, and W's tile is double-buffered: one barrier per step. A block covers
// kRowsTokens * 128 tokens and one chunk of features (rows_chunk); chunks are summed in a
// second pass in chunk order.
constexpr int kRowsThreads = 128;
constexpr int kRowsTokens = 2;
constexpr int kRowsBlockTokens = kRowsThreads * kRowsTokens;
constexpr int kRowsStep = 16;  // features per tile of W
constexpr int kRowsVectors = kRowsStep / 8;
// Features per block at least: a chunk writes rank fp32 partial sums per token, at rank 32
// and 128 features half the bytes it reads of x.
constexpr int kRowsMinChunk = 128;
constexpr int kRowsMaxChunk = 1024;  // features per block at most

// One step of a thread's rows: 16-byte vectors of x and, with dropout, their mask bytes.
struct RowsStep {
  uint4 x[kRowsTokens][kRowsVectors];
  uint2 keep[kRowsTokens][kRowsVectors];
};

// Four blocks per SM at rank 16 (119-127 registers), three at rank 32 (161-168): the caps keep
// the dropout variants, with their mask bytes in flight, from losing a block.
template <typename T, int kRank, bool kMask>
__global__ void __launch_bounds__(kRowsThreads, kRank <= 16 ? 4 : 3)
    rows_times_adapter_kernel(AdapterRows x, AdapterMatrix w, int rank, int chunk, float alpha,
                              float* out, float* partial) {
  constexpr int kTileLoads = kRowsStep * kRank / kRowsThreads;
  __shared__ float4 tile[2][kRowsStep][kRank / 4];
  const int64_t k_begin = static_cast<int64_t>(blockIdx.y) * chunk;
  const int64_t k_end = k_begin + chunk < x.features ? k_begin + chunk : x.features;
  int64_t token[kRowsTokens];
  bool active[kRowsTokens];
#pragma unroll
  for (int i = 0; i < kRowsTokens; ++i) {
    token[i] = static_cast<int64_t>(blockIdx.x) * kRowsBlockTokens + i * kRowsThreads + threadIdx.x;
    active[i] = token[i] < x.tokens;
  }
  // The tile is read along W's contiguous dimension (features for lora_A, ranks for lora_B),
  // so the loads coalesce; element i of a thread's share is (feature e, rank j).
  const bool features_fastest = w.stride_k == 1;
  auto tile_index = [&](int l, int& e, int& j) {
    const int i = threadIdx.x + l * kRowsThreads;
    e = features_fastest ? i % kRowsStep : i / kRank;
    j = features_fastest ? i / kRowsStep : i % kRank;
  };
  auto load_w = [&](int64_t k0, float(&v)[kTileLoads]) {
#pragma unroll
    for (int l = 0; l < kTileLoads; ++l) {
      int e, j;
      tile_index(l, e, j);
      const int64_t k = k0 + e;
      v[l] = j < rank && k < k_end ? w.data[j * w.stride_j + k * w.stride_k] : 0.0f;
    }
  };
  auto store_w = [&](int buffer, const float(&v)[kTileLoads]) {
    float* flat = reinterpret_cast<float*>(tile[buffer]);
#pragma unroll
    for (int l = 0; l < kTileLoads; ++l) {
      int e, j;
      tile_index(l, e, j);
      flat[e * kRank + j] = v[l];
    }
  };
  // Features are a multiple of 8 and W's tile is 0 past k_end; a token past the batch reads
  // zeros and writes nothing.
  auto load_x = [&](int64_t k0, RowsStep& step) {
#pragma unroll
    for (int i = 0; i < kRowsTokens; ++i) {
#pragma unroll
      for (int s = 0; s < kRowsVectors; ++s) {
        const int64_t k = k0 + 8 * s;
        const bool in = active[i] && k < k_end;
        const int64_t at = token[i] * x.features + k;
        step.x[i][s] = in ? *reinterpret_cast<const uint4*>(static_cast<const T*>(x.data) + at)
                          : make_uint4(0u, 0u, 0u, 0u);
        if (kMask)
          step.keep[i][s] = in ? *reinterpret_cast<const uint2*>(x.mask + at) : make_uint2(0u, 0u);
      }
    }
  };

  float acc[kRowsTokens][kRank] = {};
  float w_next[kTileLoads];
  RowsStep next;
  load_w(k_begin, w_next);
  store_w(0, w_next);
  load_x(k_begin, next);
  __syncthreads();
  int buffer = 0;
  for (int64_t k0 = k_begin; k0 < k_end; k0 += kRowsStep, buffer ^= 1) {
    const RowsStep step = next;
    const bool more = k0 + kRowsStep < k_end;
    if (more) {
      load_w(k0 + kRowsStep, w_next);
      load_x(k0 + kRowsStep, next);
    }
#pragma unroll
    for (int s = 0; s < kRowsVectors; ++s) {
      float v[kRowsTokens][8];
#pragma unroll
      for (int i = 0; i < kRowsTokens; ++i) {
        load_values<T, 8>(reinterpret_cast<const T*>(&step.x[i][s]), v[i]);
        if (kMask)
          apply_mask<8>(reinterpret_cast<const uint8_t*>(&step.keep[i][s]), x.keep_scale, v[i]);
      }
#pragma unroll
      for (int e = 0; e < 8; ++e) {
#pragma unroll
        for (int j = 0; j < kRank / 4; ++j) {
          const float4 wj = tile[buffer][8 * s + e][j];
#pragma unroll
          for (int i = 0; i < kRowsTokens; ++i) {
            acc[i][4 * j] = fmaf(v[i][e], wj.x, acc[i][4 * j]);
            acc[i][4 * j + 1] = fmaf(v[i][e], wj.y, acc[i][4 * j + 1]);
            acc[i][4 * j + 2] = fmaf(v[i][e], wj.z, acc[i][4 * j + 2]);
            acc[i][4 * j + 3] = fmaf(v[i][e], wj.w, acc[i][4 * j + 3]);
          }
        }
      }
    }
    // The other buffer was last read before the previous barrier.
    if (more) store_w(buffer ^ 1, w_next);
    __syncthreads();
  }
  const bool direct = gridDim.y == 1;
#pragma unroll
  for (int i = 0; i < kRowsTokens; ++i) {
    if (!active[i]) continue;
    float* dst =
        direct ? out + token[i] * rank : partial + (blockIdx.y * x.tokens + token[i]) * rank;
#pragma unroll
    for (int j = 0; j < kRank; ++j)
      if (j < rank) dst[j] = direct ? alpha * acc[i][j] : acc[i][j];
  }
}

// out[i] = alpha * sum_s partial[s * n + i], s in order.
__global__ void sum_chunks_kernel(const float* partial, int chunks, int64_t n, float alpha,
                                  float* out) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  float s = 0.0f;
  for (int c = 0; c < chunks; ++c) s += partial[c * n + i];
  out[i] = alpha * s;
}

// ---- y += alpha * mask * (P W) ------------------------------------------------------------
// A thread owns kCols neighbouring features and holds W's [rank, kCols] slice of them in
// registers (64 values whatever the rank); it walks kAddTokens tokens, reading P's row from
// shared memory (a broadcast). At ranks 16 and 32 the registers are held to 128, four blocks
// per SM: three blocks leave too few warps to hide the loads. Rank 8's eight columns need more.
constexpr int kAddThreads = 128;
constexpr int kAddTokens = 64;
constexpr int kAddBatch = 8;

template <typename T, int kRank>
__global__ void __launch_bounds__(kAddThreads, kRank == 8 ? 1 : 4)
    add_low_rank_kernel(AddLowRank a) {
  constexpr int kCols = 64 / kRank;
  __shared__ float4 p_tile[kAddTokens][kRank / 4];
  const int64_t k = (static_cast<int64_t>(blockIdx.x) * kAddThreads + threadIdx.x) * kCols;
  const int64_t t0 = static_cast<int64_t>(blockIdx.y) * kAddTokens;
  const int tokens = static_cast<int>(a.tokens - t0 < kAddTokens ? a.tokens - t0 : kAddTokens);
  float* flat = reinterpret_cast<float*>(p_tile);
  for (int i = threadIdx.x; i < kAddTokens * kRank; i += kAddThreads) {
    const int t = i / kRank, j = i % kRank;
    flat[i] = t < tokens && j < a.rank ? a.p[(t0 + t) * a.rank + j] : 0.0f;
  }
  __syncthreads();
  if (k >= a.features) return;
  float w[kRank][kCols];
  if (a.w.stride_j == 1 && a.rank % 4 == 0) {
    // lora_B [out, r]: a feature's ranks are contiguous, four per 16-byte load.
#pragma unroll
    for (int c = 0; c < kCols; ++c) {
#pragma unroll
      for (int j = 0; j < kRank; j += 4) {
        const float4 q =
            j < a.rank ? *reinterpret_cast<const float4*>(a.w.data + (k + c) * a.w.stride_k + j)
                       : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        w[j][c] = q.x, w[j + 1][c] = q.y, w[j + 2][c] = q.z, w[j + 3][c] = q.w;
      }
    }
  } else {
#pragma unroll
    for (int j = 0; j < kRank; ++j) {
#pragma unroll
      for (int c = 0; c < kCols; ++c)
        w[j][c] = j < a.rank ? a.w.data[j * a.w.stride_j + (k + c) * a.w.stride_k] : 0.0f;
    }
  }
  // Pointers advance by a batch of rows: indexing each token from the block's origin costs
  // 64-bit products per access, rematerialised, which crowd out the loop's FMAs.
  const int64_t stride = a.features;
  T* y = static_cast<T*>(a.y) + t0 * stride + k;
  const uint8_t* mask = a.mask != nullptr ? a.mask + t0 * stride + k : nullptr;
  // kBatch tokens' loads issued before the first use: one load in flight per thread left
  // the kernel waiting on memory latency at a fraction of the bandwidth.
  for (int b = 0; b < tokens; b += kAddBatch, y += kAddBatch * stride) {
    float v[kAddBatch][kCols];
#pragma unroll
    for (int i = 0; i < kAddBatch; ++i)
      if (b + i < tokens) load_values<T, kCols>(y + i * stride, v[i]);
#pragma unroll
    for (int i = 0; i < kAddBatch; ++i) {
      if (b + i >= tokens) break;
      float term[kCols] = {};
#pragma unroll
      for (int j = 0; j < kRank / 4; ++j) {
        const float4 p = p_tile[b + i][j];
#pragma unroll
        for (int c = 0; c < kCols; ++c) {
          term[c] = fmaf(p.x, w[4 * j][c], term[c]);
          term[c] = fmaf(p.y, w[4 * j + 1][c], term[c]);
          term[c] = fmaf(p.z, w[4 * j + 2][c], term[c]);
          term[c] = fmaf(p.w, w[4 * j + 3][c], term[c]);
        }
      }
      if (mask != nullptr) apply_mask<kCols>(mask + (b + i) * stride, 1.0f, term);
#pragma unroll
      for (int c = 0; c < kCols; ++c) v[i][c] = fmaf(a.alpha, term[c], v[i][c]);
      store_values<T, kCols>(y + i * stride, v[i]);
    }
  }
}

// ---- O = alpha * P^T x --------------------------------------------------------------------
// A thread owns 8 neighbouring features and kRankBlock ranks of one block of tokens
// (outer_tokens): per token one 16-byte load of x and P's kRankBlock values from shared memory.
// The next kOuterBatch tokens' x is loaded while this batch is summed (loading and summing in
// turn leaves the kernel waiting on memory). Token blocks are summed in
// order in a second pass, which also applies alpha and the strides.
constexpr int kOuterThreads = 128;
constexpr int kOuterMaxTokens = 256;  // tokens per block at most; a multiple of kOuterBatch
constexpr int kOuterMinTokens = 32;
constexpr int kOuterBatch = 4;

// A batch of a thread's x: one 16-byte vector per token and, with dropout, its mask bytes.
struct OuterBatch {
  uint4 x[kOuterBatch];
  uint2 keep[kOuterBatch];
};

// Four blocks per SM: the batch loaded ahead took the dropout variant to 155-167 registers
// (three blocks) without the cap; with it, 128 and no spills.
template <typename T, int kRankBlock, bool kMask>
__global__ void __launch_bounds__(kOuterThreads, 4)
    outer_product_kernel(AdapterRows x, const float* p, int rank, int block_tokens,
                         float* partial) {
  __shared__ float4 p_tile[kOuterMaxTokens][kRankBlock / 4];
  const int j0 = blockIdx.x * kRankBlock;
  const int64_t k = (static_cast<int64_t>(blockIdx.y) * kOuterThreads + threadIdx.x) * 8;
  const int64_t t0 = static_cast<int64_t>(blockIdx.z) * block_tokens;
  const int tokens = static_cast<int>(x.tokens - t0 < block_tokens ? x.tokens - t0 : block_tokens);
  float* flat = reinterpret_cast<float*>(p_tile);
  for (int i = threadIdx.x; i < block_tokens * kRankBlock; i += kOuterThreads) {
    const int t = i / kRankBlock, j = j0 + i % kRankBlock;
    flat[i] = t < tokens && j < rank ? p[(t0 + t) * rank + j] : 0.0f;
  }
  __syncthreads();
  if (k >= x.features) return;
  const T* row = static_cast<const T*>(x.data) + t0 * x.features + k;
  const uint8_t* mask = kMask ? x.mask + t0 * x.features + k : nullptr;
  // Tokens past the block read zeros; P is zero there too.
  auto load = [&](int b, OuterBatch& batch) {
#pragma unroll
    for (int i = 0; i < kOuterBatch; ++i) {
      const bool in = b + i < tokens;
      const int64_t at = static_cast<int64_t>(b + i) * x.features;
      batch.x[i] = in ? *reinterpret_cast<const uint4*>(row + at) : make_uint4(0u, 0u, 0u, 0u);
      if (kMask)
        batch.keep[i] = in ? *reinterpret_cast<const uint2*>(mask + at) : make_uint2(0u, 0u);
    }
  };
  float acc[kRankBlock][8] = {};
  OuterBatch next;
  load(0, next);
  for (int b = 0; b < tokens; b += kOuterBatch) {
    const OuterBatch batch = next;
    if (b + kOuterBatch < tokens) load(b + kOuterBatch, next);
#pragma unroll
    for (int i = 0; i < kOuterBatch; ++i) {
      float v[8];
      load_values<T, 8>(reinterpret_cast<const T*>(&batch.x[i]), v);
      if (kMask) apply_mask<8>(reinterpret_cast<const uint8_t*>(&batch.keep[i]), x.keep_scale, v);
#pragma unroll
      for (int j = 0; j < kRankBlock / 4; ++j) {
        const float4 pj = p_tile[b + i][j];
#pragma unroll
        for (int c = 0; c < 8; ++c) {
          acc[4 * j][c] = fmaf(pj.x, v[c], acc[4 * j][c]);
          acc[4 * j + 1][c] = fmaf(pj.y, v[c], acc[4 * j + 1][c]);
          acc[4 * j + 2][c] = fmaf(pj.z, v[c], acc[4 * j + 2][c]);
          acc[4 * j + 3][c] = fmaf(pj.w, v[c], acc[4 * j + 3][c]);
        }
      }
    }
  }
  // partial[z][j][k]: features fastest, so the second pass reads it coalesced.
  const int64_t plane = static_cast<int64_t>(rank) * x.features;
#pragma unroll
  for (int j = 0; j < kRankBlock; ++j) {
    if (j0 + j >= rank) break;
    float* dst = partial + blockIdx.z * plane + (j0 + j) * x.features + k;
    reinterpret_cast<float4*>(dst)[0] = make_float4(acc[j][0], acc[j][1], acc[j][2], acc[j][3]);
    reinterpret_cast<float4*>(dst)[1] = make_float4(acc[j][4], acc[j][5], acc[j][6], acc[j][7]);
  }
}

__global__ void sum_outer_kernel(const float* partial, int blocks, int rank, int64_t features,
                                 float alpha, float* out, int64_t stride_j, int64_t stride_k) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t plane = static_cast<int64_t>(rank) * features;
  if (i >= plane) return;
  float s = 0.0f;
  for (int b = 0; b < blocks; ++b) s += partial[b * plane + i];
  const int64_t j = i / features, k = i % features;
  out[j * stride_j + k * stride_k] = alpha * s;
}

int padded_rank(int rank) {
  return rank <= 8 ? 8 : rank <= 16 ? 16 : 32;
}

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

int64_t clamp(int64_t v, int64_t low, int64_t high) {
  return v < low ? low : v > high ? high : v;
}

// How the sums over features (rows_times) and tokens (outer_product) are split. Few tokens
// left the grids at a fraction of the SMs (64 blocks at 2048 tokens and 4096 features, where
// an H200 has 132 SMs), so the split aims at kTargetBlocks blocks. It depends on the shape
// alone, never on the GPU: a sum is split, and rounded, the same way on every device.
constexpr int64_t kTargetBlocks = 512;

// Features per block of rows_times_adapter: a multiple of kRowsStep.
int rows_chunk(int64_t tokens, int64_t features) {
  // At least one block of tokens: the glue sizes the workspace before an empty batch returns.
  const int64_t token_blocks = std::max<int64_t>(ceil_div(tokens, kRowsBlockTokens), 1);
  const int64_t chunks = ceil_div(kTargetBlocks, token_blocks);
  const int64_t chunk = ceil_div(ceil_div(features, chunks), kRowsStep) * kRowsStep;
  return static_cast<int>(clamp(chunk, kRowsMinChunk, kRowsMaxChunk));
}

// Eight ranks per block: 64 accumulators per thread leave room for four blocks per SM; a
// larger rank re-reads x once per eight ranks, from L2 (the rank blocks of one tile of x
// are neighbours in the grid).
constexpr int kOuterRankBlock = 8;

// Tokens per block of outer_product: a multiple of kOuterBatch.
int outer_tokens(int64_t tokens, int64_t features, int rank) {
  const int64_t per_token_block =
      ceil_div(rank, kOuterRankBlock) * ceil_div(features, int64_t{kOuterThreads} * 8);
  const int64_t token_blocks = ceil_div(kTargetBlocks, std::max<int64_t>(per_token_block, 1));
  const int64_t per = ceil_div(ceil_div(tokens, token_blocks), kOuterBatch) * kOuterBatch;
  return static_cast<int>(clamp(per, kOuterMinTokens, kOuterMaxTokens));
}

template <typename T>
void rows_times_typed(const RowsTimesAdapter& a, cudaStream_t stream) {
  const int chunk = rows_chunk(a.x.tokens, a.x.features);
  const dim3 grid(static_cast<unsigned>(ceil_div(a.x.tokens, kRowsBlockTokens)),
                  static_cast<unsigned>(ceil_div(a.x.features, chunk)));
  const int r = a.rank <= 16 ? 16 : padded_rank(a.rank);  // tiles of 4 ranks, at least 16
  const bool mask = a.x.mask != nullptr;
  const auto kernel = r == 16 ? (mask ? rows_times_adapter_kernel<T, 16, true>
                                      : rows_times_adapter_kernel<T, 16, false>)
                              : (mask ? rows_times_adapter_kernel<T, 32, true>
                                      : rows_times_adapter_kernel<T, 32, false>);
  kernel<<<grid, kRowsThreads, 0, stream>>>(a.x, a.w, a.rank, chunk, a.alpha, a.out, a.workspace);
  if (grid.y > 1) {
    const int64_t n = a.x.tokens * a.rank;
    sum_chunks_kernel<<<static_cast<unsigned>(ceil_div(n, 256)), 256, 0, stream>>>(
        a.workspace, static_cast<int>(grid.y), n, a.alpha, a.out);
  }
}

template <typename T>
void add_low_rank_typed(const AddLowRank& a, cudaStream_t stream) {
  const int r = padded_rank(a.rank);
  const int cols = 64 / r;
  const dim3 grid(static_cast<unsigned>(ceil_div(a.features, int64_t{kAddThreads} * cols)),
                  static_cast<unsigned>(ceil_div(a.tokens, kAddTokens)));
  const auto kernel = r == 8    ? add_low_rank_kernel<T, 8>
                      : r == 16 ? add_low_rank_kernel<T, 16>
                                : add_low_rank_kernel<T, 32>;
  kernel<<<grid, kAddThreads, 0, stream>>>(a);
}

template <typename T>
void outer_product_typed(const OuterProductSum& a, cudaStream_t stream) {
  const int block_tokens = outer_tokens(a.x.tokens, a.x.features, a.rank);
  const dim3 grid(static_cast<unsigned>(ceil_div(a.rank, kOuterRankBlock)),
                  static_cast<unsigned>(ceil_div(a.x.features, int64_t{kOuterThreads} * 8)),
                  static_cast<unsigned>(ceil_div(a.x.tokens, block_tokens)));
  const auto kernel = a.x.mask != nullptr ? outer_product_kernel<T, kOuterRankBlock, true>
                                          : outer_product_kernel<T, kOuterRankBlock, false>;
  kernel<<<grid, kOuterThreads, 0, stream>>>(a.x, a.p, a.rank, block_tokens, a.workspace);
  const int64_t plane = static_cast<int64_t>(a.rank) * a.x.features;
  sum_outer_kernel<<<static_cast<unsigned>(ceil_div(plane, 256)), 256, 0, stream>>>(
      a.workspace, static_cast<int>(grid.z), a.rank, a.x.features, a.alpha, a.out, a.out_stride_j,
      a.out_stride_k);
}

bool valid(const AdapterRows& x, int rank) {
  return x.features % 8 == 0 && rank >= 1 && rank <= kAdapterMaxRank &&
         (x.type == ElementType::kFloat16 || x.type == ElementType::kBFloat16) &&
         x.tokens < (int64_t{1} << 31) * kRowsBlockTokens &&
         ceil_div(x.tokens, kOuterMaxTokens) <= 65535;
}

}  // namespace

int64_t rows_times_adapter_workspace(int64_t tokens, int64_t features, int rank) {
  const int64_t chunks = ceil_div(features, rows_chunk(tokens, features));
  return chunks > 1 ? chunks * tokens * rank : 0;
}

int64_t outer_product_sum_workspace(int64_t tokens, int64_t features, int rank) {
  return ceil_div(tokens, outer_tokens(tokens, features, rank)) * rank * features;
}

cudaError_t launch_rows_times_adapter(const RowsTimesAdapter& a, cudaStream_t stream) {
  if (!valid(a.x, a.rank)) return cudaErrorInvalidValue;
  if (a.x.tokens == 0) return cudaSuccess;
  if (a.x.type == ElementType::kFloat16)
    rows_times_typed<__half>(a, stream);
  else
    rows_times_typed<__nv_bfloat16>(a, stream);
  return cudaGetLastError();
}

cudaError_t launch_add_low_rank(const AddLowRank& a, cudaStream_t stream) {
  if (a.features % 8 != 0 || a.rank < 1 || a.rank > kAdapterMaxRank ||
      ceil_div(a.tokens, kAddTokens) > 65535 ||
      (a.type != ElementType::kFloat16 && a.type != ElementType::kBFloat16))
    return cudaErrorInvalidValue;
  if (a.tokens == 0) return cudaSuccess;
  if (a.type == ElementType::kFloat16)
    add_low_rank_typed<__half>(a, stream);
  else
    add_low_rank_typed<__nv_bfloat16>(a, stream);
  return cudaGetLastError();
}

cudaError_t launch_outer_product_sum(const OuterProductSum& a, cudaStream_t stream) {
  if (!valid(a.x, a.rank)) return cudaErrorInvalidValue;
  if (a.x.tokens == 0) return cudaSuccess;  // the caller zero-fills
  if (a.x.type == ElementType::kFloat16)
    outer_product_typed<__half>(a, stream);
  else
    outer_product_typed<__nv_bfloat16>(a, stream);
  return cudaGetLastError();
}

}  // namespace gradscope::cuda

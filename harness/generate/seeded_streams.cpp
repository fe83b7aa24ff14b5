#include "harness/generate/seeded_streams.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <utility>
#include <vector>

#include "harness/generate/normal_draw.h"

namespace gradscope {
namespace {

uint64_t fnv1a64(std::string_view text) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : text) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

// SplitMix64 finaliser: spreads seed and name hash over all key bits.
uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

double to_open_unit(uint32_t high, uint32_t low) {
  const uint64_t bits53 = ((static_cast<uint64_t>(high) << 32) | low) >> 11;
  return (static_cast<double>(bits53) + 0.5) * 0x1.0p-53;
}

}  // namespace

SeededStream::SeededStream(uint64_t seed, std::string_view name) {
  const uint64_t k = mix64(mix64(seed) ^ fnv1a64(name));
  key_ = {static_cast<uint32_t>(k), static_cast<uint32_t>(k >> 32)};
}

philox::Counter SeededStream::block(uint64_t index) const {
  return philox::philox4x32_10(
      {static_cast<uint32_t>(index), static_cast<uint32_t>(index >> 32), 0u, 0u}, key_);
}

double SeededStream::uniform(uint64_t index) const {
  const auto b = block(index);
  return to_open_unit(b[0], b[1]);
}

double SeededStream::normal(uint64_t index) const {
  const auto b = block(index);
  const double u1 = to_open_unit(b[0], b[1]), u2 = to_open_unit(b[2], b[3]);
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
}

uint64_t SeededStream::bits64(uint64_t index) const {
  const auto b = block(index);
  return (static_cast<uint64_t>(b[0]) << 32) | b[1];
}

namespace {

// stddev * normal(i) for every element i, stored as T (a double rounded to the nearest float
// for fp32, the conversion ATen's copy makes). Element i depends on i alone, so threads cannot
// change the values.
template <class T>
at::Tensor draw_normal(uint64_t seed, std::string_view name, at::IntArrayRef shape, double stddev,
                       at::ScalarType dtype) {
  const SeededStream stream(seed, name);
  auto t = at::empty(shape, dtype);
  T* p = t.data_ptr<T>();
  at::parallel_for(0, t.numel(), 1 << 14, [&](int64_t begin, int64_t end) {
    if constexpr (std::is_same_v<T, float>) {
      // The vectorised evaluation decides all but about one value in 2^15; those are drawn
      // as the fp64 tensor draws them (normal_draw.h).
      constexpr int64_t kChunk = 4096;
      int64_t undecided[kChunk];
      for (int64_t at = begin; at < end; at += kChunk) {
        const int64_t count = std::min(kChunk, end - at);
        const int64_t left = normal_draw::fp32_block(stream.key(), static_cast<uint64_t>(at), count,
                                                     stddev, p + at, undecided);
        for (int64_t j = 0; j < left; ++j) {
          const int64_t i = at + undecided[j];
          p[i] = static_cast<float>(stddev * stream.normal(static_cast<uint64_t>(i)));
        }
      }
    } else {
      for (int64_t i = begin; i < end; ++i) p[i] = static_cast<T>(stddev * stream.normal(i));
    }
  });
  return t;
}

}  // namespace

at::Tensor normal_tensor(uint64_t seed, std::string_view name, at::IntArrayRef shape,
                         double stddev) {
  return draw_normal<double>(seed, name, shape, stddev, at::kDouble);
}

at::Tensor normal_tensor_fp32(uint64_t seed, std::string_view name, at::IntArrayRef shape,
                              double stddev) {
  return draw_normal<float>(seed, name, shape, stddev, at::kFloat);
}

at::Tensor uniform_tensor(uint64_t seed, std::string_view name, at::IntArrayRef shape) {
  const SeededStream stream(seed, name);
  auto t = at::empty(shape, at::kDouble);
  double* p = t.data_ptr<double>();
  at::parallel_for(0, t.numel(), 1 << 14, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) p[i] = stream.uniform(i);
  });
  return t;
}

at::Tensor permutation(uint64_t seed, std::string_view name, int64_t n) {
  const SeededStream stream(seed, name);
  // Sort by a random key per element (ties by index): order-independent and exact.
  std::vector<std::pair<uint64_t, int64_t>> keyed(n);
  for (int64_t i = 0; i < n; ++i) keyed[i] = {stream.bits64(i), i};
  std::sort(keyed.begin(), keyed.end());
  std::vector<int64_t> order(n);
  for (int64_t i = 0; i < n; ++i) order[i] = keyed[i].second;
  return at::tensor(order, at::kLong);
}

}  // namespace gradscope

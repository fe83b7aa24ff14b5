// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3",
// SC'11): a counter-based generator, so any element of any stream can be drawn
// directly from (key, counter) with identical results on every platform.
#pragma once

#include <array>
#include <cstdint>

namespace gradscope::philox {

using Counter = std::array<uint32_t, 4>;
using Key = std::array<uint32_t, 2>;

inline constexpr uint32_t kMultiplier0 = 0xD2511F53u;
inline constexpr uint32_t kMultiplier1 = 0xCD9E8D57u;
inline constexpr uint32_t kWeyl0 = 0x9E3779B9u;  // golden ratio
inline constexpr uint32_t kWeyl1 = 0xBB67AE85u;  // sqrt(3) - 1

constexpr Counter round(const Counter& c, const Key& k) {
  const uint64_t p0 = static_cast<uint64_t>(kMultiplier0) * c[0];
  const uint64_t p1 = static_cast<uint64_t>(kMultiplier1) * c[2];
  return {static_cast<uint32_t>(p1 >> 32) ^ c[1] ^ k[0], static_cast<uint32_t>(p1),
          static_cast<uint32_t>(p0 >> 32) ^ c[3] ^ k[1], static_cast<uint32_t>(p0)};
}

// Ten rounds; the key is bumped by the Weyl constants between rounds.
constexpr Counter philox4x32_10(Counter counter, Key key) {
  for (int r = 0; r < 10; ++r) {
    if (r > 0) key = {key[0] + kWeyl0, key[1] + kWeyl1};
    counter = round(counter, key);
  }
  return counter;
}

}  // namespace gradscope::philox

#include "harness/generate/normal_draw.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

namespace gradscope::normal_draw {
namespace {

inline uint64_t bits_of(double x) {
  uint64_t b;
  std::memcpy(&b, &x, sizeof b);
  return b;
}

inline double double_of(uint64_t b) {
  double x;
  std::memcpy(&x, &b, sizeof x);
  return x;
}

// pi/2 in three parts: the first two carry 33 significant bits each, so that n times them
// (n <= 4) is exact; together the three hold about 120 bits of pi/2, so that the reduced
// argument keeps its relative accuracy even for the double nearest a multiple of pi/2.
constexpr double kHalfPi1 = 0x1.921fb544p+0;
constexpr double kHalfPi2 = 0x1.0b4611a6p-34;
constexpr double kHalfPi3 = 0x1.3198a2e037073p-69;
constexpr double kTwoOverPi = 0x1.45f306dc9c883p-1;
constexpr double kLn2 = 0x1.62e42fefa39efp-1;

// Relative half-width of the interval that must hold the defining draw's value. The
// evaluation below differs from the exact value by a few units of 2^-53 (each series is
// truncated below 2^-55 relative, each step rounds once), and the C library's log and cos by
// less than one more each: 2^-40 is thousands of such units (the differences measured:
// docs/measurements/normal-draw-cpu.log), while an interval this narrow holds an fp32
// rounding boundary about once in 2^15 draws.
constexpr double kMargin = 0x1.0p-40;

// Integers below 2^52 to double and back through the bits of 2^52 + i: exact, and without
// the 64-bit integer conversions that AVX2 lacks, so that the loops below vectorise.
constexpr uint64_t kTwo52Bits = 0x4330000000000000ull;
constexpr double kTwo52 = 0x1.0p52;

// log(u) for u in (0, 1]: u = 2^e m with m in [sqrt(1/2), sqrt(2)), log m = 2 atanh(s) with
// s = (m - 1) / (m + 1), |s| <= 0.172, as the odd series of atanh up to s^19. Adding
// bits(1) - bits(sqrt(1/2)) to u's bits carries into the exponent exactly when m >= sqrt(2):
// e and m without a branch.
inline double log_unit(double u) {
  constexpr uint64_t kHalfSqrt2Bits = 0x3fe6a09e667f3bcdull;  // sqrt(1/2)
  const uint64_t t = bits_of(u) + (0x3ff0000000000000ull - kHalfSqrt2Bits);
  const double e = double_of((t >> 52) | kTwo52Bits) - (kTwo52 + 1023.0);
  const double m = double_of((t & 0x000fffffffffffffull) + kHalfSqrt2Bits);
  const double f = m - 1.0;  // exact: m is within a factor of 2 of 1
  const double s = f / (2.0 + f);
  const double z = s * s;
  double p = 1.0 / 19;
  p = p * z + 1.0 / 17, p = p * z + 1.0 / 15, p = p * z + 1.0 / 13, p = p * z + 1.0 / 11;
  p = p * z + 1.0 / 9, p = p * z + 1.0 / 7, p = p * z + 1.0 / 5, p = p * z + 1.0 / 3;
  p = p * z + 1.0;
  return e * kLn2 + 2.0 * s * p;
}

// to_open_unit's value of the 53 bits: their half (below 2^52) through 2^52's bits, doubled,
// plus the low bit, is the exact conversion; then the same two roundings.
inline double unit_of_bits53(uint64_t bits53) {
  const double half = double_of((bits53 >> 1) | kTwo52Bits) - kTwo52;
  const double low = double_of((bits53 & 1) | kTwo52Bits) - kTwo52;
  return (2.0 * half + low + 0.5) * 0x1.0p-53;
}

constexpr double factorial(int k) {
  return k <= 1 ? 1.0 : k * factorial(k - 1);
}

// cos(x) for x in [0, 2 pi]: x = n pi/2 + r with |r| <= pi/4 (n rounded through 1.5 * 2^52,
// whose low bits then hold it), then +-cos r or +-sin r, each a Taylor series to the term
// r^16 or r^17 (k! is exact in a double up to 18!); the quadrant picks by bit masks.
inline double cos_turn(double x) {
  constexpr double kRound = 0x1.8p52;
  const double shifted = x * kTwoOverPi + kRound;
  const uint64_t n = bits_of(shifted) & 7;  // 0..4
  const double dn = shifted - kRound;
  const double r = ((x - dn * kHalfPi1) - dn * kHalfPi2) - dn * kHalfPi3;
  const double z = r * r;
  double c = 1.0 / factorial(16), s = 1.0 / factorial(17);
  c = c * -z + 1.0 / factorial(14), s = s * -z + 1.0 / factorial(15);
  c = c * -z + 1.0 / factorial(12), s = s * -z + 1.0 / factorial(13);
  c = c * -z + 1.0 / factorial(10), s = s * -z + 1.0 / factorial(11);
  c = c * -z + 1.0 / factorial(8), s = s * -z + 1.0 / factorial(9);
  c = c * -z + 1.0 / factorial(6), s = s * -z + 1.0 / factorial(7);
  c = c * -z + 1.0 / factorial(4), s = s * -z + 1.0 / factorial(5);
  c = c * -z + 1.0 / factorial(2), s = s * -z + 1.0 / factorial(3);
  c = c * -z + 1.0, s = (s * -z + 1.0) * r;
  // n = 0..4: cos r, -sin r, -cos r, sin r, cos r.
  const uint64_t odd = 0 - (n & 1);
  const uint64_t sign = ((n + 1) & 2) << 62;
  return double_of(((bits_of(c) & ~odd) | (bits_of(s) & odd)) ^ sign);
}

// The fp32 value of x = stddev * draw where the margin's interval around x rounds to one fp32
// number, else NaN (left to the defining evaluation). A zero (u1 = 1) keeps the sign the C
// library's evaluation gives it: left to that one too.
inline float decided(double x) {
  const float lo = static_cast<float>(x * (1.0 - kMargin));
  const float hi = static_cast<float>(x * (1.0 + kMargin));
  return ((lo == hi) & (x != 0.0)) ? lo : std::numeric_limits<float>::quiet_NaN();
}

}  // namespace

Candidate fp32_candidate(double u1, double u2, double stddev) {
  const float value =
      decided(stddev * (std::sqrt(-2.0 * log_unit(u1)) * cos_turn(2.0 * M_PI * u2)));
  return {value, !std::isnan(value)};
}

int64_t fp32_block(const philox::Key& key, uint64_t first, int64_t count, double stddev, float* out,
                   int64_t* undecided) {
  // Lanes as arrays, each step a loop of its own without branches, so that the compiler
  // vectorises every step.
  constexpr int kLanes = 64;
  int64_t left_over = 0;
  for (int64_t start = 0; start < count; start += kLanes) {
    const int lanes = static_cast<int>(std::min<int64_t>(kLanes, count - start));
    // philox::philox4x32_10, lane by lane (the same rounds, the same key schedule); words
    // held in 64-bit lanes.
    uint64_t c0[kLanes], c1[kLanes], c2[kLanes], c3[kLanes];
    for (int j = 0; j < kLanes; ++j) {
      const uint64_t index = first + static_cast<uint64_t>(start + j);
      c0[j] = index & 0xffffffffu;
      c1[j] = index >> 32;
      c2[j] = c3[j] = 0;
    }
    uint64_t k0 = key[0], k1 = key[1];
    for (int r = 0; r < 10; ++r) {
      if (r > 0) k0 = (k0 + philox::kWeyl0) & 0xffffffffu, k1 = (k1 + philox::kWeyl1) & 0xffffffffu;
      for (int j = 0; j < kLanes; ++j) {
        const uint64_t p0 = philox::kMultiplier0 * c0[j];
        const uint64_t p1 = philox::kMultiplier1 * c2[j];
        const uint64_t n0 = (p1 >> 32) ^ c1[j] ^ k0;
        const uint64_t n2 = (p0 >> 32) ^ c3[j] ^ k1;
        c1[j] = p1 & 0xffffffffu;
        c3[j] = p0 & 0xffffffffu;
        c0[j] = n0;
        c2[j] = n2;
      }
    }
    double u1[kLanes], u2[kLanes];
    for (int j = 0; j < kLanes; ++j) {
      u1[j] = unit_of_bits53(((c0[j] << 32) | c1[j]) >> 11);
      u2[j] = unit_of_bits53(((c2[j] << 32) | c3[j]) >> 11);
    }
    double v[kLanes];
    for (int j = 0; j < kLanes; ++j) v[j] = log_unit(u1[j]);
    for (int j = 0; j < kLanes; ++j) v[j] = std::sqrt(-2.0 * v[j]) * cos_turn(2.0 * M_PI * u2[j]);
    // An undecided value is NaN until the caller draws it: a forgotten one cannot pass.
    float value[kLanes];
    for (int j = 0; j < kLanes; ++j) value[j] = decided(stddev * v[j]);
    for (int j = 0; j < lanes; ++j) {
      out[start + j] = value[j];
      if (std::isnan(value[j])) undecided[left_over++] = start + j;
    }
  }
  return left_over;
}

}  // namespace gradscope::normal_draw

// The seeded normal draw rounded to fp32, in vectorised blocks (docs/verification.md, "Seeds").
// Torch-free, so that it can be compiled for the machine's vector ISA.
#pragma once

#include <cstdint>

#include "harness/generate/philox.h"

namespace gradscope::normal_draw {

// SeededStream::normal (seeded_streams.h) defines the draw: sqrt(-2 log u1) cos(2 pi u2) of
// the two uniforms of an element's Philox block, with the C library's log and cos. This is the
// same draw evaluated without the C library, with a bound on its relative error from the
// defining one far below the spacing of fp32 values: the fp32 value of stddev * draw is
// certain unless that bound's interval holds an fp32 rounding boundary. Used by fp32_block;
// exposed for the test that probes the quadrant and exponent edges.
struct Candidate {
  float value;
  bool certain;
};
Candidate fp32_candidate(double u1, double u2, double stddev);

// out[j] = float(stddev * normal(first + j)) of the stream with this key, for j in [0, count)
// wherever fp32_candidate is certain; where it is not, out[j] is NaN and the offset j is
// written to undecided (room for count), for the caller to draw with SeededStream::normal; the
// number of such offsets is returned.
// Vectorised over lanes; the values do not depend on the ISA the file is compiled for.
int64_t fp32_block(const philox::Key& key, uint64_t first, int64_t count, double stddev, float* out,
                   int64_t* undecided);

}  // namespace gradscope::normal_draw

// Element formulas of SwiGLU shared by the CPU code and the CUDA kernel (no torch headers).
#pragma once

#include <cmath>

#include "packed_bits.h"  // GRADSCOPE_HOST_DEVICE

namespace gradscope::swiglu_math {

// The injectable faults of SwiGLU (gradscope/faults.h), as both implementations apply them.
enum Mode : int {
  kCorrect = 0,
  kDerivativeMissingTerm = 1,  // d silu/de = sigmoid(e): the e (1 - sigmoid(e)) term lost
  kSigmoidOverflow = 2,        // sigmoid(e) = exp(e) / (1 + exp(e)): NaN once exp(e) overflows
};

GRADSCOPE_HOST_DEVICE float sigmoid(float e, int mode = kCorrect) {
  if (mode == kSigmoidOverflow) {
    const float x = expf(e);
    return x / (1.0f + x);
  }
  return 1.0f / (1.0f + expf(-e));
}

struct Grad {
  float de;
  float dg;
};

// d/de [silu(e) g] = g * sigmoid(e) * (1 + e * (1 - sigmoid(e))); d/dg = silu(e).
GRADSCOPE_HOST_DEVICE Grad backward(float dh, float e, float g, int mode = kCorrect) {
  const float s = sigmoid(e, mode);
  const bool full = mode != kDerivativeMissingTerm;
  return {dh * g * s * (full ? 1.0f + e * (1.0f - s) : 1.0f), dh * e * s};
}

}  // namespace gradscope::swiglu_math

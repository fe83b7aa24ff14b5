// Element formulas of SwiGLU shared by the CPU code and the CUDA kernel (no torch headers).
#pragma once

#include <cmath>

#include "packed_bits.h"  // GRADSCOPE_HOST_DEVICE

namespace gradscope::swiglu_math {

GRADSCOPE_HOST_DEVICE float sigmoid(float e) {
  return 1.0f / (1.0f + expf(-e));
}

struct Grad {
  float de;
  float dg;
};

// d/de [silu(e) g] = g * sigmoid(e) * (1 + e * (1 - sigmoid(e))); d/dg = silu(e).
// `full_derivative` false drops the e (1 - sigmoid(e)) term (an injected fault).
GRADSCOPE_HOST_DEVICE Grad backward(float dh, float e, float g, bool full_derivative = true) {
  const float s = sigmoid(e);
  return {dh * g * s * (full_derivative ? 1.0f + e * (1.0f - s) : 1.0f), dh * e * s};
}

}  // namespace gradscope::swiglu_math

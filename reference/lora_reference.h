// fp64 reference of the fused LoRA ops (docs/lora-math.md): forward and
// hand-written backward on Eigen matrices, rows = tokens. Checked against finite
// differences in tests/lora_reference_test.cpp.
#pragma once

#include <Eigen/Core>

#include "reference/gptq_reference.h"

namespace gradscope::reference {

struct Projection {
  Matrix weight_t;          // W^T [in, out], dequantized
  Eigen::RowVectorXd bias;  // [out], or size 0 for none
  Matrix lora_A;            // [r, in]
  Matrix lora_B;            // [out, r]
  double scaling = 1;
};

struct Dropout {
  double p = 0;
  Matrix mask;  // 0/1, same shape as the adapter input; unused when p == 0
};

// X_d = X * mask / (1 - p).
Matrix dropped(const Matrix& x, const Dropout& d);

// Y = X W^T + b + s (X_d A^T) B^T.
Matrix lora_forward(const Matrix& x, const Projection& p, const Dropout& d);

struct ProjectionGrads {
  Matrix dx;  // dY W + s ((dY B) A) * mask / (1 - p)
  Matrix dA;  // s (dY B)^T X_d
  Matrix dB;  // s dY^T (X_d A^T)
};
ProjectionGrads lora_backward(const Matrix& x, const Matrix& dy, const Projection& p,
                              const Dropout& d);

struct QkvOutputs {
  Matrix q, k, v;
};
struct QkvGrads {
  Matrix dx;
  ProjectionGrads q, k, v;  // their dx are each projection's share of dx
};
QkvOutputs qkv_forward(const Matrix& x, const Projection& q, const Projection& k,
                       const Projection& v, const Dropout& d);
QkvGrads qkv_backward(const Matrix& x, const Matrix& dq, const Matrix& dk, const Matrix& dv,
                      const Projection& q, const Projection& k, const Projection& v,
                      const Dropout& d);

// silu(e) = e * sigmoid(e); h = silu(e) * g.
Matrix swiglu(const Matrix& e, const Matrix& g);

struct MlpGrads {
  Matrix dx;
  ProjectionGrads gate, up, down;
};
Matrix mlp_forward(const Matrix& x, const Projection& gate, const Projection& up,
                   const Projection& down, const Dropout& dx, const Dropout& dh);
MlpGrads mlp_backward(const Matrix& x, const Matrix& dy, const Projection& gate,
                      const Projection& up, const Projection& down, const Dropout& dx,
                      const Dropout& dh);
// The forward values the backward needs, e = gate(x) and g = up(x): a caller that keeps
// them (a decoder layer's tape) spares the backward two of the MLP's three products.
struct MlpTape {
  Matrix e, g;
};
MlpTape mlp_tape(const Matrix& x, const Projection& gate, const Projection& up, const Dropout& dx);
MlpGrads mlp_backward(const MlpTape& tape, const Matrix& x, const Matrix& dy,
                      const Projection& gate, const Projection& up, const Projection& down,
                      const Dropout& dx, const Dropout& dh);

}  // namespace gradscope::reference

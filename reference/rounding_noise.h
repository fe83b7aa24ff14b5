// The rounding-noise model behind the verdict's floor (docs/verification.md, "The floor").
//
// For every value the fp64 reference computes, the model gives the variance of the error a
// careful implementation in narrower formats commits, propagated to first order through the
// same computation. A careful implementation:
//   - gets the case's inputs exactly (they are generated in its formats);
//   - may round every intermediate it keeps to the activation format, and rounds the
//     dequantized weights to it once;
//   - runs the adapter path (X_d A^T, its products with B, the adapter gradients) in the
//     adapter compute format, the wider of the activation and adapter formats;
//   - accumulates every sum (matrix products, norms, softmax) in the accumulation format, in
//     any order, and rounds each output to its own format.
// Each rounding error is modelled as independent, zero-mean and bounded by u |v| (u the unit
// roundoff; half the smallest subnormal below the normal range). An error e with variance
// var carried through a linear map J adds (J o J) var (o: elementwise product) to the
// variance downstream. A sum of K terms accumulated recursively rounds K partial sums S_k,
// adding u^2 sum_k S_k^2 <= u^2 K/2 (sum_k t_k^2 + S^2) for terms of either sign pattern.
//
// Variances are fp64 matrices of the shape of the value they describe. The model also
// records the largest magnitude of each intermediate held in the activation format, so the
// verdict can tell a case the format cannot represent from a kernel that overflows.
#pragma once

#include <limits>
#include <string>
#include <vector>

#include "reference/causal_lm_reference.h"
#include "reference/layer_reference.h"
#include "reference/lora_reference.h"

namespace gradscope::reference {

// A floating-point format described by numbers only (the reference knows no dtypes).
struct Format {
  double unit_roundoff = 0;  // u = 2^-p: fp32 2^-24, fp16 2^-11, bf16 2^-8
  // Largest error below the normal range: half the smallest subnormal for a stored value; the
  // smallest normal for the accumulation format, whose arithmetic may flush subnormals to zero.
  double subnormal = 0;
  double max = std::numeric_limits<double>::infinity();  // largest finite value
};

struct Precision {
  Format activation;       // inputs, outputs and every intermediate of the activation path
  Format adapter_compute;  // the adapter path
  Format adapter;          // lora_A, lora_B and their gradients as stored
  Format accumulate;       // sums inside products and reductions
};

// The largest |value| of one intermediate held in the activation format.
struct StoredValue {
  std::string name;  // e.g. "mlp/h", "layer1/attention/scores"
  double max_abs = 0;
};

struct ProjectionForwardNoise {
  Matrix y;   // output
  Matrix xa;  // X_d A^T (the adapter path), kept for the backward
};
struct ProjectionGradsNoise {
  Matrix dx, dA, dB;
};
struct MlpNoise {
  Matrix y, dx;
  ProjectionGradsNoise gate, up, down;
};
struct LayerForwardNoise {
  Matrix out;
};
// The largest error of an attention score a careful implementation makes (its standard
// deviation, in the scores' natural-log units), where it is and the score's exact value.
struct ScoreError {
  double sigma = 0, score = 0;
  int64_t batch = 0, head = 0, query = 0, key = 0;
};
// Scores reach softmax through exp: the model takes e^dS - 1 as dS, to first order. At this
// modelled standard deviation (each rounding taken at its bound) the shortfall stays within the
// floor's margin; past it, it grows fast, the floor no longer bounds a careful implementation's
// error, and what depends on that attention cannot be judged (docs/verification.md, "What the
// model approximates").
constexpr double kScoreSigmaFirstOrder = 1.0;
struct LayerNoise {
  Matrix out, dx;
  ProjectionGradsNoise q, k, v, o, gate, up, down;
  ScoreError scores;  // its attention's, against kScoreSigmaFirstOrder
};

// Building blocks, each the variance of one reference op's result from its inputs'
// variances (empty: exact) and the op's own roundings; `act` is the format results are stored
// in, `acc` the one sums accumulate in. Checked against finite-difference Jacobians in
// tests/rounding_noise_test.cpp.
//
// Variance of rounding each element of v into f: (u v)^2 + subnormal^2.
Matrix rounding_variance(const Matrix& v, const Format& f);
// h = silu(e) g, silu(e) possibly rounded first. `inputs` multiplies the inputs' share: 1 for
// independent errors of e and g, 2 where both carry one upstream error ((a + b)^2 <= 2a^2 + 2b^2).
Matrix swiglu_variance(const Matrix& e, const Matrix& g, const Matrix& var_e, const Matrix& var_g,
                       const Format& act, const Format& acc, double inputs = 1.0);
struct SwigluGradsNoise {
  Matrix dg, de;          // the values, dh silu(e) and dh g silu'(e)
  Matrix var_dg, var_de;  // their variances
};
SwigluGradsNoise swiglu_backward_variance(const Matrix& e, const Matrix& g, const Matrix& dh,
                                          const Matrix& var_e, const Matrix& var_g,
                                          const Matrix& var_dh, const Format& act,
                                          const Format& acc, double inputs = 1.0);
// RMSNorm (statistics accumulated in acc) and its backward dx.
Matrix rmsnorm_variance(const Matrix& x, const Matrix& var_x, const RmsNorm& norm,
                        const Format& act, const Format& acc);
Matrix rmsnorm_backward_variance(const Matrix& x, const Matrix& var_x, const Matrix& dy,
                                 const Matrix& var_dy, const RmsNorm& norm, const Format& act,
                                 const Format& acc);
// Rotary embedding (sign +1) or its transpose (sign -1), tables computed in acc and stored in
// act.
Matrix rope_variance(const Matrix& x, const Matrix& var_x, const AttentionShape& s, int64_t heads,
                     double sign, const Format& act, const Format& acc);
// Causal softmax of one block of scores: the probabilities and their variance.
void softmax_variance(const Matrix& scores, const Matrix& var_s, const Format& act,
                      const Format& acc, Matrix& p, Matrix& var_p);
// Causal grouped-query attention, each (batch, head) block taken `tile_rows` query rows at a
// time against only the keys they can attend (kAttentionTileRows, as the reference's; see
// docs/verification.md, "The reference's products"): the tile size changes no value beyond
// rounding; the tests vary it.
// The forward; `max_score`, when given, receives max |Q K^T / sqrt(d)| (masked scores included),
// and `scores` the largest score error (one more product a tile: the backward finds it anyway).
Matrix attention_forward_variance(const Matrix& q, const Matrix& k, const Matrix& v,
                                  const Matrix& var_q, const Matrix& var_k, const Matrix& var_v,
                                  const AttentionShape& s, const Format& act, const Format& acc,
                                  double* max_score = nullptr,
                                  int64_t tile_rows = kAttentionTileRows,
                                  ScoreError* scores = nullptr);
struct AttentionGradsNoise {
  Matrix dq, dk, dv;                    // variances
  Matrix dq_value, dk_value, dv_value;  // the gradients themselves
  ScoreError scores;                    // over every head's unmasked scores
};
AttentionGradsNoise attention_backward_variance(const Matrix& q, const Matrix& k, const Matrix& v,
                                                const Matrix& dout, const Matrix& var_q,
                                                const Matrix& var_k, const Matrix& var_v,
                                                const Matrix& var_dout, const AttentionShape& s,
                                                const Format& act, const Format& acc,
                                                int64_t tile_rows = kAttentionTileRows);

class RoundingNoise {
 public:
  explicit RoundingNoise(const Precision& precision) : p_(precision) {}

  // Each op takes the reference's own results (the values it already computed) and returns
  // the variances of the same tensors. An empty variance matrix is an exact input.
  //
  // One projection: forward on x (variance var_x) giving y; backward from dy giving `grads`.
  ProjectionForwardNoise lora_forward(const Matrix& x, const Matrix& var_x, const Projection& proj,
                                      const Dropout& d, const Matrix& y, const std::string& name);
  ProjectionGradsNoise lora_backward(const Matrix& x, const Matrix& var_x, const Matrix& dy,
                                     const Matrix& var_dy, const Projection& proj, const Dropout& d,
                                     const ProjectionForwardNoise& forward,
                                     const ProjectionGrads& grads, const std::string& name);
  // The SwiGLU MLP on an exact input with an exact output gradient.
  MlpNoise mlp(const MlpTape& tape, const Matrix& x, const Matrix& dy, const Projection& gate,
               const Projection& up, const Projection& down, const Dropout& dx, const Dropout& dh,
               const Matrix& y, const MlpGrads& grads);
  // One decoder layer on an exact input x with an exact output gradient dy.
  LayerNoise layer(const LayerTape& tape, const Matrix& x, const Matrix& dy, const Layer& layer,
                   const AttentionShape& s, const LayerGrads& grads, const std::string& name);
  // A causal LM's per-token losses (a vector as a [tokens, 1] matrix); the forward only.
  // `scores`, when given, receives each layer's largest score error, in order.
  Matrix token_losses(const CausalLm& model, const std::vector<int64_t>& tokens,
                      const std::vector<int64_t>& targets,
                      std::vector<ScoreError>* scores = nullptr);

  const std::vector<StoredValue>& stored() const { return stored_; }
  // Records the largest |v| of an intermediate held in the activation format (also for sums a
  // caller composes from these results, such as a fused op's partial sums of dX).
  void store(const std::string& name, const Matrix& v);

 private:
  // The activation path of a layer, forward, with its tape's variances.
  struct LayerForward;
  LayerForward layer_forward(const LayerTape& tape, const Matrix& x, const Matrix& var_x,
                             const Layer& layer, const AttentionShape& s, const std::string& name,
                             ScoreError* scores = nullptr);

  Precision p_;
  std::vector<StoredValue> stored_;
};

}  // namespace gradscope::reference

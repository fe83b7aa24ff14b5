// Input profiles (docs/input-profiles.md): how a case's activations, output gradients and
// token positions are drawn. `unit` is N(0, 1) everywhere; `realistic` gives activations the
// per-channel scales and outlier channels of an LLM's residual stream, output gradients the
// scale of a mean token loss, and positions an offset into the model's context. Every value
// is drawn in fp64 from the case's seeded streams, so a profile replays bit for bit.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

#include "harness/spec/case_spec.h"

namespace gradscope {

enum class InputProfile { kUnit, kRealistic };

struct ProfileSpec {
  InputProfile profile;
  double x_scale;     // multiplies every activation the case draws
  double loss_scale;  // multiplies every output gradient (AMP's GradScaler factor)
  double x_zeros;     // share of activation elements set to exactly 0

  explicit ProfileSpec(const CaseSpec& spec);
  // ".realistic", ".x16", ".ls65536", ".z0.25" where they differ from the defaults.
  std::string id_part() const;
};

// profile, x_scale, loss_scale, x_zeros.
std::vector<FieldSpec> profile_fields();

// Activations [tokens, features] (rows = tokens) in fp64 from stream `name`.
//   unit:      x = x_scale * z, z ~ N(0, 1)
//   realistic: channel c has scale exp(z_c / 2); max(1, features / 256) outlier channels carry
//              x = sign_c m_c (1 + z / 10) with m_c log-uniform in [100, 1000] and a sign fixed
//              over the tokens; everything times x_scale.
//   either:    with x_zeros > 0, each element is exactly 0 with that probability (stream
//              `name`.zeros), as after a ReLU-like gate, on padding or on underflow.
at::Tensor draw_activations(uint64_t seed, const std::string& name, const ProfileSpec& p,
                            int64_t tokens, int64_t features);

// Output gradients [tokens, features] from stream `name`.
//   unit:      dY = loss_scale * z
//   realistic: dY = loss_scale * z / tokens (the gradient of a mean over the tokens)
at::Tensor draw_output_grads(uint64_t seed, const std::string& name, const ProfileSpec& p,
                             int64_t tokens, int64_t features);

// Position of a sequence's first token: `position_offset` for unit; for realistic, drawn
// uniformly from [0, max_position - seq] (stream "positions").
int64_t first_position(uint64_t seed, const ProfileSpec& p, int64_t position_offset,
                       int64_t max_position, int64_t seq);

}  // namespace gradscope

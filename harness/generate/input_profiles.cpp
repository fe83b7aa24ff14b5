#include "harness/generate/input_profiles.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <sstream>

#include "harness/generate/seeded_streams.h"

namespace gradscope {

using report::SpecValue;

std::vector<FieldSpec> profile_fields() {
  const auto s = [](const char* v) { return SpecValue(std::string(v)); };
  return {
      FieldSpec("profile", FieldType::kString, s("unit"),
                "input profile: unit (N(0, 1) inputs) or realistic (outlier channels, mean-loss "
                "gradients, positions into the context)")
          .one_of({s("unit"), s("realistic")}),
      FieldSpec("x_scale", FieldType::kFloat, 1.0, "factor on every activation the case draws")
          .in_range(1e-6, 1e6),
      FieldSpec("loss_scale", FieldType::kFloat, 1.0,
                "factor on every output gradient (AMP's GradScaler scale)")
          .in_range(1e-6, 16777216.0),
      FieldSpec("x_zeros", FieldType::kFloat, 0.0,
                "share of activation elements drawn as exactly 0 (ReLU-like gates, padding, "
                "underflow): a kernel that infers a mask from zeros fails there")
          .in_range(0.0, 0.9),
  };
}

ProfileSpec::ProfileSpec(const CaseSpec& s)
    : profile(s.get_string("profile") == "realistic" ? InputProfile::kRealistic
                                                     : InputProfile::kUnit),
      x_scale(s.get_float("x_scale")),
      loss_scale(s.get_float("loss_scale")),
      x_zeros(s.get_float("x_zeros")) {}

std::string ProfileSpec::id_part() const {
  std::ostringstream id;
  if (profile == InputProfile::kRealistic) id << ".realistic";
  if (x_scale != 1.0) id << ".x" << x_scale;
  if (loss_scale != 1.0) id << ".ls" << loss_scale;
  if (x_zeros != 0.0) id << ".z" << x_zeros;
  return id.str();
}

at::Tensor draw_activations(uint64_t seed, const std::string& name, const ProfileSpec& p,
                            int64_t tokens, int64_t features) {
  auto x = normal_tensor(seed, name, {tokens, features});
  if (p.profile == InputProfile::kRealistic) {
    const auto channel_scale =
        (normal_tensor(seed, name + ".channel_scale", {features}) * 0.5).exp();
    x.mul_(channel_scale);
    const int64_t outliers = std::max<int64_t>(1, features / 256);
    const auto channels = permutation(seed, name + ".outlier_channels", features);
    const auto magnitude = uniform_tensor(seed, name + ".outlier_magnitude", {outliers});
    const auto sign = uniform_tensor(seed, name + ".outlier_sign", {outliers});
    const auto z = normal_tensor(seed, name + ".outlier_spread", {tokens, outliers});
    for (int64_t i = 0; i < outliers; ++i) {
      const int64_t c = channels[i].item<int64_t>();
      const double m = std::pow(10.0, 2.0 + magnitude[i].item<double>());
      const double sgn = sign[i].item<double>() < 0.5 ? -1.0 : 1.0;
      x.select(1, c).copy_((z.select(1, i) * 0.1 + 1.0) * (sgn * m));
    }
  }
  if (p.x_scale != 1.0) x.mul_(p.x_scale);
  if (p.x_zeros > 0) {
    x.masked_fill_(uniform_tensor(seed, name + ".zeros", {tokens, features}) < p.x_zeros, 0.0);
  }
  return x;
}

at::Tensor draw_output_grads(uint64_t seed, const std::string& name, const ProfileSpec& p,
                             int64_t tokens, int64_t features) {
  double factor = p.loss_scale;
  if (p.profile == InputProfile::kRealistic) factor /= static_cast<double>(tokens);
  return normal_tensor(seed, name, {tokens, features}, factor);
}

int64_t first_position(uint64_t seed, const ProfileSpec& p, int64_t position_offset,
                       int64_t max_position, int64_t seq) {
  if (p.profile != InputProfile::kRealistic) return position_offset;
  const int64_t span = std::max<int64_t>(1, max_position - seq + 1);
  const SeededStream stream(seed, "positions");
  return std::min<int64_t>(span - 1, static_cast<int64_t>(stream.uniform(0) * span));
}

}  // namespace gradscope

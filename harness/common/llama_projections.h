// The seven LoRA projections of a Llama-family decoder layer, in the one order every kind,
// report, checkpoint and command uses, with the module that holds each.
#pragma once

#include <array>
#include <stdexcept>
#include <string>
#include <string_view>

namespace gradscope {

struct LlamaProjection {
  std::string_view name;    // Hugging Face name: q_proj ... down_proj
  std::string_view module;  // self_attn or mlp
};

inline constexpr std::array<LlamaProjection, 7> kLlamaProjections = {{
    {"q_proj", "self_attn"},
    {"k_proj", "self_attn"},
    {"v_proj", "self_attn"},
    {"o_proj", "self_attn"},
    {"gate_proj", "mlp"},
    {"up_proj", "mlp"},
    {"down_proj", "mlp"},
}};

inline bool is_llama_projection(std::string_view name) {
  for (const auto& p : kLlamaProjections) {
    if (p.name == name) return true;
  }
  return false;
}

inline std::string_view module_of(std::string_view projection) {
  for (const auto& p : kLlamaProjections) {
    if (p.name == projection) return p.module;
  }
  throw std::invalid_argument("unknown projection " + std::string(projection));
}

// The member for `projection` of a struct that holds one value per projection under the
// short names q, k, v, o, gate, up, down (kernels' DecoderLayer; the reference's Layer,
// LayerGrads, LayerNoise).
template <class PerProjection>
auto& member(PerProjection& layer, std::string_view projection) {
  if (projection == "q_proj") return layer.q;
  if (projection == "k_proj") return layer.k;
  if (projection == "v_proj") return layer.v;
  if (projection == "o_proj") return layer.o;
  if (projection == "gate_proj") return layer.gate;
  if (projection == "up_proj") return layer.up;
  if (projection == "down_proj") return layer.down;
  throw std::invalid_argument("unknown projection " + std::string(projection));
}

// The same for a struct of the MLP's three alone (gate, up, down: the reference's MlpGrads,
// MlpNoise).
template <class PerProjection>
auto& mlp_member(PerProjection& mlp, std::string_view projection) {
  if (projection == "gate_proj") return mlp.gate;
  if (projection == "up_proj") return mlp.up;
  if (projection == "down_proj") return mlp.down;
  throw std::invalid_argument("not an MLP projection: " + std::string(projection));
}

}  // namespace gradscope

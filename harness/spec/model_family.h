// A model family's decoder layer as data (docs/model-families.md): the parts it is made of,
// each one gradscope models, and where each configured value sits in the model's Hugging Face
// config. One declaration per file, families/<name>.toml; the layer kinds validate a case
// against its family, and the Python readers read a module through it.
#pragma once

#include <string>
#include <vector>

namespace gradscope {

// A part's value: its default, or read from one attribute of the model's config.
struct ConfiguredValue {
  std::string config;  // the attribute; empty: the part's default
  bool configured() const { return !config.empty(); }
};

struct ModelFamily {
  std::string name;  // the file's name without .toml
  std::string file;
  std::string description;
  std::vector<std::string> model_types;  // the config.model_type values it reads
  struct Norms {
    std::string kind;  // "rms": weight * x / sqrt(mean(x^2) + eps), statistics in fp32
    std::string eps;   // the config attribute holding eps
  } norms;
  struct Rope {
    std::vector<std::string> types;  // rope_type values read ("default")
    std::string theta;               // the key of the base in the rope parameters
  } rope;
  struct Attention {
    std::string heads, kv_heads;     // config attributes
    std::string mask;                // "causal"
    ConfiguredValue scaling;         // the scores' scale; default 1 / sqrt(head_dim)
    ConfiguredValue sliding_window;  // default: none
  } attention;
  struct Mlp {
    std::string activation;  // "silu": down(silu(gate(x)) * up(x))
  } mlp;
  struct Residual {
    ConfiguredValue multiplier;  // each block's output times it before the add; default 1
  } residual;
  // The projections by the module holding them, in the order the engine checks them.
  std::vector<std::string> self_attn, mlp_projections;
};

// The folder declarations are read from: $GRADSCOPE_FAMILIES_DIR, else the source tree's
// families/.
std::string families_dir();
// Every declaration in families_dir(), by name; read once per folder. InputError naming the
// file and key of one that is malformed or declares what gradscope does not model.
const std::vector<ModelFamily>& model_families();
// InputError naming the families known when there is none called `name`.
const ModelFamily& model_family(const std::string& name);
// The declaration in one file (for tests and the walk-through).
ModelFamily read_model_family(const std::string& path);

}  // namespace gradscope

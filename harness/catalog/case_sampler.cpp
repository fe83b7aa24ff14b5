#include "harness/catalog/case_sampler.h"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "harness/catalog/case_file.h"
#include "harness/common/input_error.h"
#include "harness/generate/seeded_streams.h"

namespace gradscope {
namespace {

// Draws of one case from its own stream: each call takes the next element.
class Dice {
 public:
  Dice(uint64_t seed, const std::string& name) : stream_(seed, name) {}
  double uniform() { return stream_.uniform(next_++); }
  bool chance(double p) { return uniform() < p; }
  template <class T>
  const T& pick(const std::vector<T>& options) {
    return options[std::min(options.size() - 1, static_cast<size_t>(uniform() * options.size()))];
  }
  int64_t between(int64_t lo, int64_t hi) {  // inclusive
    return lo + std::min<int64_t>(hi - lo, static_cast<int64_t>(uniform() * (hi - lo + 1)));
  }

 private:
  SeededStream stream_;
  uint64_t next_ = 0;
};

// Case-file text, one key per line.
class Toml {
 public:
  void set(const std::string& key, const std::string& v) { out_ << key << " = \"" << v << "\"\n"; }
  void set(const std::string& key, const char* v) { set(key, std::string(v)); }
  void set(const std::string& key, int64_t v) { out_ << key << " = " << v << "\n"; }
  void set(const std::string& key, int v) { set(key, static_cast<int64_t>(v)); }
  void set(const std::string& key, bool v) {
    out_ << key << " = " << (v ? "true" : "false") << "\n";
  }
  void set(const std::string& key, double v) {
    std::ostringstream s;
    s.precision(17);
    s << v;
    std::string t = s.str();
    if (t.find_first_of(".en") == std::string::npos) t += ".0";
    out_ << key << " = " << t << "\n";
  }
  std::string str() const { return out_.str(); }

 private:
  std::ostringstream out_;
};

const std::vector<std::string> kDtypes = {"fp32", "fp16", "bf16"};

// A feature count in [lo, hi] that packs at `bits`: half the time an odd multiple of the
// format's smallest step (32 / bits, 32 at 3 bits), the tail of any tile larger than the step;
// otherwise a multiple of 32 (docs/coverage.md).
int64_t width(Dice& d, int64_t bits, int64_t lo, int64_t hi) {
  const int64_t step = bits == 3 ? 32 : 32 / bits;
  if (d.chance(0.5)) {
    const int64_t first = (lo + step - 1) / step, last = hi / step;
    int64_t m = d.between(first, last) | 1;
    if (m > last) m -= 2;
    if (m >= first) return step * m;
  }
  return 32 * d.between((lo + 31) / 32, hi / 32);
}

// The GPTQ fields; returns the bit width, which the feature counts depend on.
int64_t gptq_fields(Dice& d, Toml& t) {
  const int64_t bits = d.pick<int64_t>({2, 3, 4, 8});
  t.set("bits", bits);
  t.set("group_size", d.pick<int64_t>({-1, 32, 64, 128}));
  const bool act = d.chance(0.5);
  t.set("desc_act", act);
  if (act) t.set("static_groups", d.chance(0.25));
  t.set("sym", d.chance(0.5));
  t.set("format", d.chance(0.5) ? "gptq" : "gptq_v2");
  t.set("scales_dtype", d.chance(0.8) ? "fp16" : "bf16");
  return bits;
}

// The fields of the LoRA kinds: adapters, tokens, the input profile. `dropout` and a 2-D input
// only where the kind takes them.
void lora_fields(Dice& d, Toml& t, bool dropout, bool flat_input, int64_t max_tokens) {
  t.set("rank", d.pick<int64_t>({1, 2, 4, 8, 16, 32}));
  t.set("alpha", std::round(std::exp2(d.uniform() * 7.0) * 4.0) / 4.0);  // 1 .. 128
  t.set("rslora", d.chance(0.3));
  if (dropout) t.set("dropout", d.pick<double>({0.0, 0.0, 0.05, 0.1, 0.3}));
  t.set("bias", d.chance(0.3));
  t.set("adapter_dtype", d.chance(0.6) ? "fp32" : d.pick(kDtypes));
  int64_t batch = d.pick<int64_t>({1, 1, 2, 3, 4});
  if (flat_input && d.chance(0.2)) batch = 0;
  // Half the time a count at a block's tail (1, 2^k - 1, 2^k + 1, odd) rather than a round one.
  const int64_t drawn =
      d.chance(0.5) ? d.pick<int64_t>({1, 3, 7, 9, 15, 17, 31, 33, 63, 65, 127, 129, 255, 257})
                    : d.pick<int64_t>({16, 32, 48, 64});
  const int64_t seq = std::min<int64_t>(drawn, max_tokens / std::max<int64_t>(batch, 1));
  t.set("batch", batch);
  t.set("seq", std::max<int64_t>(seq, 1));
  const bool realistic = d.chance(0.5);
  t.set("profile", realistic ? "realistic" : "unit");
  if (d.chance(0.2)) t.set("x_scale", std::exp2(d.between(1, 6)));
  if (d.chance(0.3)) t.set("loss_scale", d.pick<double>({8.0, 1024.0, 65536.0}));
}

void dequant_case(Dice& d, Toml& t) {
  const int64_t bits = gptq_fields(d, t);
  t.set("in_features", width(d, bits, 32, 512));
  t.set("out_features", width(d, bits, 32, 512));
  t.set("storage", d.pick<std::string>({"int32", "int32", "fp32", "fp16", "bf16"}));
  t.set("layout", d.chance(0.7) ? "in_out" : "out_in");
  t.set("edge_codes", d.chance(0.7));
}

void lora_w_case(Dice& d, Toml& t) {
  const int64_t bits = gptq_fields(d, t);
  t.set("in_features", width(d, bits, 32, 512));
  t.set("out_features", width(d, bits, 32, 512));
  lora_fields(d, t, true, true, 256);
}

void qkv_case(Dice& d, Toml& t) {
  const int64_t bits = gptq_fields(d, t);
  const int64_t step = bits == 3 ? 32 : 32 / bits;
  // head_dim a multiple of the step, so that k_proj's kv_heads * head_dim packs.
  const int64_t head_dim = d.chance(0.5) ? step * d.pick<int64_t>({1, 3, 5})
                                         : std::max(step, d.pick<int64_t>({16, 32, 64}));
  const int64_t heads = d.pick<int64_t>({2, 3, 4, 8});
  t.set("hidden", head_dim * heads);
  t.set("heads", heads);
  t.set("kv_heads", d.chance(0.5) ? heads : d.pick<int64_t>({1, 2}));
  lora_fields(d, t, true, true, 256);
}

void mlp_case(Dice& d, Toml& t) {
  const int64_t bits = gptq_fields(d, t);
  t.set("hidden", width(d, bits, 64, 384));
  t.set("intermediate", width(d, bits, 64, 768));
  lora_fields(d, t, true, true, 256);
}

// The decoder-layer shape fields shared by layer, training.
void stack_fields(Dice& d, Toml& t, int64_t bits) {
  const int64_t head_dim = d.pick<int64_t>({16, 32});
  const int64_t heads = d.pick<int64_t>({2, 4});
  t.set("hidden", head_dim * heads);
  t.set("heads", heads);
  t.set("kv_heads", d.chance(0.5) ? heads : 1);
  t.set("intermediate", width(d, bits, 64, 256));
}

void layer_case(Dice& d, Toml& t) {
  stack_fields(d, t, gptq_fields(d, t));
  t.set("layers", d.pick<int64_t>({1, 1, 2}));
  lora_fields(d, t, false, false, 96);
}

void training_case(Dice& d, Toml& t) {
  stack_fields(d, t, gptq_fields(d, t));
  t.set("layers", 1);
  t.set("vocab", d.pick<int64_t>({16, 32, 64}));
  t.set("steps", d.between(2, 4));
  t.set("lr", d.pick<double>({1e-3, 5e-3}));
  lora_fields(d, t, false, false, 48);
}

void fsdp_case(Dice& d, Toml& t) {
  const int64_t world = d.pick<int64_t>({1, 2, 4});
  t.set("world_size", world);
  t.set("sharding", d.chance(0.5) ? "flat" : "per_param");
  t.set("storage", d.pick<std::string>({"int32", "fp32", "bf16"}));
  // Multiples of 32 for now: shards that need padding are not drawn (docs/coverage.md).
  t.set("hidden", 32 * d.between(2, 8));
  t.set("intermediate", 32 * d.between(2, 12));
  t.set("rank", d.pick<int64_t>({4, 8, 16}));
  t.set("alpha", d.pick<double>({8.0, 16.0, 32.0}));
  t.set("adapter_dtype", d.chance(0.7) ? "fp32" : d.pick(kDtypes));
  t.set("batch", 4);
  t.set("seq", d.pick<int64_t>({4, 8, 16}));
  t.set("profile", d.chance(0.5) ? "realistic" : "unit");
  gptq_fields(d, t);
}

// The positions of a layer case whose profile is unit: sometimes deep into a context.
void positions(Dice& d, Toml& t, const std::string& kind, const std::string& text) {
  if (kind != "layer" && kind != "training") return;
  if (text.find("profile = \"realistic\"") != std::string::npos) {
    if (d.chance(0.5)) t.set("max_position", d.pick<int64_t>({2048, 8192}));
  } else if (d.chance(0.4)) {
    t.set("position_offset", d.between(0, 8192));
  }
}

}  // namespace

const std::vector<std::string>& sampled_kinds() {
  static const std::vector<std::string> kinds = {"dequant", "lora_w",   "qkv", "mlp",
                                                 "layer",   "training", "fsdp"};
  return kinds;
}

SampleDraw draw_cases(const SampleOptions& o) {
  const auto& kinds = o.kinds.empty() ? sampled_kinds() : o.kinds;
  for (const auto& k : kinds) {
    if (std::find(sampled_kinds().begin(), sampled_kinds().end(), k) == sampled_kinds().end()) {
      throw InputError("--kinds: the sampler draws no kind '" + k + "'");
    }
  }
  SampleDraw out;
  for (int64_t i = 0; i < o.count; ++i) {
    for (int attempt = 0;; ++attempt) {
      if (attempt == 100) {
        throw std::runtime_error("sample " + std::to_string(i) + ": no valid case in 100 draws");
      }
      Dice d(o.seed, "sample." + std::to_string(i) + "." + std::to_string(attempt));
      const std::string kind = d.pick(kinds);
      Toml t;
      t.set("kind", kind);
      t.set("seed", d.between(1, 1000000));
      t.set("dtype", d.pick(kDtypes));
      t.set("device", o.device);
      if (kind == "dequant") dequant_case(d, t);
      if (kind == "lora_w") lora_w_case(d, t);
      if (kind == "qkv") qkv_case(d, t);
      if (kind == "mlp") mlp_case(d, t);
      if (kind == "layer") layer_case(d, t);
      if (kind == "training") training_case(d, t);
      if (kind == "fsdp") fsdp_case(d, t);
      positions(d, t, kind, t.str());
      // Exact zeros in the activations, from a stream of their own: the draws above stay what
      // they were for every seed.
      if (kind == "lora_w" || kind == "qkv" || kind == "mlp" || kind == "layer") {
        Dice z(o.seed, "sample." + std::to_string(i) + "." + std::to_string(attempt) + ".x_zeros");
        if (z.chance(0.15)) t.set("x_zeros", z.chance(0.5) ? 0.1 : 0.5);
      }
      const std::string text = t.str();
      try {
        auto specs = parse_case_text(text, "<sample " + std::to_string(i) + ">");
        out.cases.push_back({text, std::move(specs.front())});
        break;
      } catch (const InputError&) {
        ++out.rejected;  // a shape rule the draw broke (3-bit widths, GQA): draw again
      }
    }
  }
  return out;
}

}  // namespace gradscope

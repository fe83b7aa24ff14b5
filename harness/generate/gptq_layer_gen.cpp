#include "harness/generate/gptq_layer_gen.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <list>
#include <mutex>
#include <new>
#include <optional>
#include <string>
#include <tuple>

#include "harness/common/dtypes.h"
#include "harness/common/host_memory.h"
#include "harness/generate/seeded_streams.h"

namespace gradscope {
namespace {

// A suite's files vary the dtype, the rank or the adapters of one seeded layer far more often
// than the layer itself, and drawing and quantizing a weight is most of a case's generate
// phase. The latest layers are kept (codes as bytes: every supported width fits one) and
// handed out as fresh copies, so a caller may write into what it gets; a kept layer is the
// same function of the same arguments, so no drawn value can change.
struct LayerKey {
  uint64_t seed;
  std::string prefix;
  int64_t k, n;
  int bits, group_size, min_zero;
  bool sym, desc_act, static_groups;
  auto tie() const {
    return std::tie(seed, prefix, k, n, bits, group_size, min_zero, sym, desc_act, static_groups);
  }
  bool operator==(const LayerKey& o) const { return tie() == o.tie(); }
};

struct KeptLayer {
  LayerKey key;
  QuantizedWeight q;  // codes uint8
  double bytes;
};

class KeptLayers {
 public:
  std::optional<QuantizedWeight> find(const LayerKey& key) {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto it =
        std::find_if(kept_.begin(), kept_.end(), [&](const KeptLayer& l) { return l.key == key; });
    if (it == kept_.end()) return std::nullopt;
    kept_.splice(kept_.begin(), kept_, it);  // most recently used first
    const QuantizedWeight& q = it->q;
    return QuantizedWeight{q.codes.to(at::kInt), q.zeros.clone(), q.scales.clone(),
                           q.g_idx.clone()};
  }

  // Keeping is optional: a copy that cannot be allocated is not kept.
  void keep(const LayerKey& key, const QuantizedWeight& q) try {
    QuantizedWeight stored{q.codes.to(at::kByte), q.zeros.clone(), q.scales.clone(),
                           q.g_idx.clone()};
    double bytes = 0;
    for (const auto* t : {&stored.codes, &stored.zeros, &stored.scales, &stored.g_idx}) {
      bytes += static_cast<double>(t->nbytes());
    }
    std::lock_guard<std::mutex> lock(mutex_);
    // Too large, or kept meanwhile by another thread drawing the same layer.
    if (bytes > budget() ||
        std::any_of(kept_.begin(), kept_.end(), [&](const KeptLayer& l) { return l.key == key; })) {
      return;
    }
    kept_.push_front({key, std::move(stored), bytes});
    held_ += bytes;
    while (held_ > budget()) {
      held_ -= kept_.back().bytes;
      kept_.pop_back();
    }
  } catch (const std::bad_alloc&) {
  } catch (const c10::Error&) {
  }

  double held() {
    std::lock_guard<std::mutex> lock(mutex_);
    return held_;
  }

  void drop() {
    std::lock_guard<std::mutex> lock(mutex_);
    kept_.clear();
    held_ = 0;
  }

 private:
  // At most 2 GiB, and a sixteenth of the machine: room for a 70B MLP's three layers.
  static double budget() {
    static const double b = [] {
      const double memory = host_memory_bytes();
      return std::min(2.0 * (1 << 30), memory > 0 ? memory / 16 : 0.0);
    }();
    return b;
  }

  std::mutex mutex_;
  std::list<KeptLayer> kept_;
  double held_ = 0;
};

KeptLayers& kept_layers() {
  static KeptLayers kept;
  return kept;
}

}  // namespace

GptqGenSpec::GptqGenSpec(const CaseSpec& s)
    : bits(static_cast<int>(s.get_int("bits"))),
      group_size(static_cast<int>(s.get_int("group_size"))),
      desc_act(s.get_bool("desc_act")),
      static_groups(s.get_bool("static_groups")),
      sym(s.get_bool("sym")),
      format(parse_zero_point_format(s.get_string("format"))),
      scales_dtype(dtype_from_name(s.get_string("scales_dtype"))) {}

std::string GptqGenSpec::id_part() const {
  std::string id = "b" + std::to_string(bits) + "g" +
                   (group_size == -1 ? std::string("all") : std::to_string(group_size));
  if (desc_act) id += static_groups ? ".act-static" : ".act";
  id += format == ZeroPointFormat::kGptqV1 ? ".v1" : ".v2";
  id += sym ? ".sym" : ".asym";
  if (scales_dtype != at::kHalf) id += ".scales-bf16";
  return id;
}

std::vector<FieldSpec> gptq_fields() {
  const auto s = [](const char* v) { return report::SpecValue(std::string(v)); };
  return {
      FieldSpec("bits", FieldType::kInt, int64_t{4}, "bits per code")
          .one_of({int64_t{2}, int64_t{3}, int64_t{4}, int64_t{8}}),
      FieldSpec("group_size", FieldType::kInt, int64_t{128}, "rows per scale group; -1 = one group")
          .in_range(-1, 1 << 20),
      FieldSpec("desc_act", FieldType::kBool, false, "act-order: rows quantized in a seeded order"),
      FieldSpec("static_groups", FieldType::kBool, false,
                "with desc_act: g_idx stays k / group_size"),
      FieldSpec("sym", FieldType::kBool, true, "symmetric quantization (zero (maxq + 1) / 2)"),
      FieldSpec("format", FieldType::kString, s("gptq"), "zero-point convention")
          .one_of({s("gptq"), s("gptq_v2")}),
      FieldSpec("scales_dtype", FieldType::kString, s("fp16"), "dtype of the stored scales")
          .one_of({s("fp16"), s("bf16")}),
  };
}

void validate_gptq_fields(const CaseSpec& s) {
  if (s.get_int("group_size") == 0)
    throw_field_error(s, "group_size", "must be -1 or positive, got 0");
  if (s.get_bool("static_groups") && !s.get_bool("desc_act")) {
    throw_field_error(s, "static_groups", "only applies with desc_act = true");
  }
}

void validate_gptq_shape(const CaseSpec& spec, int64_t K, int64_t N, const std::string& k_field,
                         const std::string& n_field) {
  const int bits = static_cast<int>(spec.get_int("bits"));
  const int64_t multiple = packing_multiple(bits);
  const std::string why =
      bits == 3 ? " for 3-bit packing" : " to fill whole " + std::to_string(bits) + "-bit words";
  if (K % multiple != 0) {
    throw_field_error(spec, k_field,
                      "must be a multiple of " + std::to_string(multiple) + why +
                          " (qweight), got " + std::to_string(K));
  }
  if (N % multiple != 0) {
    throw_field_error(spec, n_field,
                      "must be a multiple of " + std::to_string(multiple) + why +
                          " (qzeros), got " + std::to_string(N));
  }
}

QuantizedWeight draw_seeded_layer(uint64_t seed, const std::string& prefix, int64_t K, int64_t N,
                                  const QuantizeOptions& options) {
  const auto weight_t = normal_tensor_fp32(seed, prefix + "weight", {K, N}, 0.02);
  const auto order = options.desc_act ? permutation(seed, prefix + "act_order", K) : at::Tensor();
  return quantize_gptq(weight_t, order, options);
}

QuantizedWeight quantize_seeded_layer(uint64_t seed, const std::string& prefix, int64_t K,
                                      int64_t N, const QuantizeOptions& options) {
  const LayerKey key{seed,
                     prefix,
                     K,
                     N,
                     options.bits,
                     options.group_size,
                     options.min_zero,
                     options.sym,
                     options.desc_act,
                     options.static_groups};
  if (auto kept = kept_layers().find(key)) return std::move(*kept);
  auto q = draw_seeded_layer(seed, prefix, K, N, options);
  kept_layers().keep(key, q);
  return q;
}

double kept_layer_bytes() {
  return kept_layers().held();
}

void drop_kept_layers() {
  kept_layers().drop();
}

QuantizedWeight quantize_seeded_layer(uint64_t seed, const std::string& prefix, int64_t K,
                                      int64_t N, const GptqGenSpec& spec) {
  return quantize_seeded_layer(seed, prefix, K, N,
                               quantize_options(spec.bits, spec.group_size, spec.sym, spec.desc_act,
                                                spec.static_groups, spec.format));
}

QuantizeOptions quantize_options(int bits, int group_size, bool sym, bool desc_act,
                                 bool static_groups, ZeroPointFormat format) {
  QuantizeOptions options;
  options.bits = bits;
  options.group_size = group_size;
  options.sym = sym;
  options.desc_act = desc_act;
  options.static_groups = static_groups;
  options.min_zero = format == ZeroPointFormat::kGptqV1 ? 1 : 0;
  return options;
}

void plant_edge_values(QuantizedWeight& q, const GptqGenSpec& spec) {
  const int64_t K = q.codes.size(0), N = q.codes.size(1);
  const int maxq = max_code(spec.bits);
  const int high_bit = 1 << (spec.bits - 1);
  const int patterns[4] = {maxq, 0, high_bit, maxq ^ high_bit};
  auto codes = q.codes.accessor<int32_t, 2>();
  for (int64_t row : {int64_t{10}, int64_t{21}}) {
    if (row >= K) continue;
    for (int64_t n = 0; n < N; ++n) codes[row][n] = patterns[(n + row) % 4];
  }
  // v1 stores zero - 1, so its extremes are zero 1 (field 0) and maxq + 1 (field maxq).
  const int lowest = spec.format == ZeroPointFormat::kGptqV1 ? 1 : 0;
  auto zeros = q.zeros.accessor<int32_t, 2>();
  for (int64_t n = 0; n < N; n += 4) {
    zeros[0][n] = lowest;
    if (n + 1 < N) zeros[0][n + 1] = lowest + maxq;
  }
}

}  // namespace gradscope

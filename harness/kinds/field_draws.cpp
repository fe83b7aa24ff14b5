#include "harness/kinds/field_draws.h"

#include <cmath>
#include <string>
#include <vector>

namespace gradscope::field_draws {
namespace {

const std::vector<std::string> kDtypes = {"fp32", "fp16", "bf16"};

}  // namespace

const std::string& float_dtype(CaseDraw& d) {
  return d.pick(kDtypes);
}

int64_t width(CaseDraw& d, int64_t bits, int64_t lo, int64_t hi) {
  const int64_t step = bits == 3 ? 32 : 32 / bits;
  if (d.chance(0.5)) {
    const int64_t first = (lo + step - 1) / step, last = hi / step;
    int64_t m = d.between(first, last) | 1;
    if (m > last) m -= 2;
    if (m >= first) return step * m;
  }
  return 32 * d.between((lo + 31) / 32, hi / 32);
}

int64_t gptq(CaseDraw& d) {
  const int64_t bits = d.pick<int64_t>({2, 3, 4, 8});
  d.set("bits", bits);
  d.set("group_size", d.pick<int64_t>({-1, 32, 64, 128}));
  const bool act = d.chance(0.5);
  d.set("desc_act", act);
  if (act) d.set("static_groups", d.chance(0.25));
  d.set("sym", d.chance(0.5));
  d.set("format", d.chance(0.5) ? "gptq" : "gptq_v2");
  d.set("scales_dtype", d.chance(0.8) ? "fp16" : "bf16");
  return bits;
}

void lora(CaseDraw& d, bool dropout, bool flat_input, int64_t max_tokens) {
  d.set("rank", d.pick<int64_t>({1, 2, 4, 8, 16, 32}));
  d.set("alpha", std::round(std::exp2(d.uniform() * 7.0) * 4.0) / 4.0);  // 1 .. 128
  d.set("rslora", d.chance(0.3));
  if (dropout) d.set("dropout", d.pick<double>({0.0, 0.0, 0.05, 0.1, 0.3}));
  d.set("bias", d.chance(0.3));
  d.set("adapter_dtype", d.chance(0.6) ? "fp32" : d.pick(kDtypes));
  int64_t batch = d.pick<int64_t>({1, 1, 2, 3, 4});
  if (flat_input && d.chance(0.2)) batch = 0;
  // Half the time a count at a block's tail (1, 2^k - 1, 2^k + 1, odd) rather than a round one.
  const int64_t drawn =
      d.chance(0.5) ? d.pick<int64_t>({1, 3, 7, 9, 15, 17, 31, 33, 63, 65, 127, 129, 255, 257})
                    : d.pick<int64_t>({16, 32, 48, 64});
  const int64_t seq = std::min<int64_t>(drawn, max_tokens / std::max<int64_t>(batch, 1));
  d.set("batch", batch);
  d.set("seq", std::max<int64_t>(seq, 1));
  const bool realistic = d.chance(0.5);
  d.set("profile", realistic ? "realistic" : "unit");
  const bool large_x = d.chance(0.2);
  if (large_x) d.set("x_scale", std::exp2(d.between(1, 6)));
  const bool large_dy = d.chance(0.3);
  if (large_dy) d.set("loss_scale", d.pick<double>({8.0, 1024.0, 65536.0}));
  // The lower edge of the range, which bf16 and fp32 hold as normal numbers and fp16 as
  // subnormals or not at all. From a stream of its own: the draws above stay as they were.
  CaseDraw small = d.substream("small_values");
  if (small.chance(0.1) && !large_x) small.set("x_scale", std::exp2(-small.between(4, 19)));
  if (small.chance(0.1) && !large_dy) small.set("loss_scale", small.pick<double>({0x1p-12, 1e-6}));
}

void decoder_shape(CaseDraw& d, int64_t bits) {
  const int64_t head_dim = d.pick<int64_t>({16, 32});
  const int64_t heads = d.pick<int64_t>({2, 4});
  d.set("hidden", head_dim * heads);
  d.set("heads", heads);
  d.set("kv_heads", d.chance(0.5) ? heads : 1);
  d.set("intermediate", width(d, bits, 64, 256));
}

void positions(CaseDraw& d) {
  if (d.has("profile", "realistic")) {
    if (d.chance(0.5)) d.set("max_position", d.pick<int64_t>({2048, 8192}));
  } else if (d.chance(0.4)) {
    d.set("position_offset", d.between(0, 8192));
  }
}

void norm_and_rope(CaseDraw& d) {
  CaseDraw r = d.substream("norm_and_rope");
  if (r.chance(0.3)) r.set("rms_eps", 1e-6);
  if (r.chance(0.3)) r.set("rope_theta", 500000.0);
}

void x_zeros(CaseDraw& d) {
  CaseDraw z = d.substream("x_zeros");
  if (z.chance(0.15)) z.set("x_zeros", z.chance(0.5) ? 0.1 : 0.5);
}

}  // namespace gradscope::field_draws

#include "harness/catalog/case_sampler.h"

#include <algorithm>
#include <stdexcept>

#include "harness/catalog/case_file.h"
#include "harness/catalog/kind_registry.h"
#include "harness/common/input_error.h"
#include "harness/generate/case_draw.h"
#include "harness/kinds/field_draws.h"

namespace gradscope {

std::vector<std::string> sampled_kinds() {
  std::vector<std::string> kinds;
  for (const auto& name : kind_names()) {
    if (find_kind(name)->sampled()) kinds.push_back(name);
  }
  return kinds;
}

SampleDraw draw_cases(const SampleOptions& o) {
  const auto known = sampled_kinds();
  const auto& kinds = o.kinds.empty() ? known : o.kinds;
  for (const auto& k : kinds) {
    if (std::find(known.begin(), known.end(), k) == known.end()) {
      throw InputError("--kinds: the sampler draws no kind '" + k + "'");
    }
  }
  SampleDraw out;
  for (int64_t i = 0; i < o.count; ++i) {
    for (int attempt = 0;; ++attempt) {
      if (attempt == 100) {
        throw std::runtime_error("sample " + std::to_string(i) + ": no valid case in 100 draws");
      }
      CaseDraw d(o.seed, "sample." + std::to_string(i) + "." + std::to_string(attempt));
      const std::string kind = d.pick(kinds);
      d.set("kind", kind);
      d.set("seed", d.between(1, 1000000));
      d.set("dtype", field_draws::float_dtype(d));
      d.set("device", o.device);
      find_kind(kind)->sample(d);
      const std::string text = d.text();
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

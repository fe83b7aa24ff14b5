// The case sampler behind `gradscope sample`: draws valid cases at random over every kind,
// field and range (docs/verification.md, "Specificity"), each as case-file text, so a drawn
// case is validated by the same loader as a written one and replays from its file.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "harness/spec/case_spec.h"

namespace gradscope {

struct SampleOptions {
  uint64_t seed = 1;    // the sampler's own seed: the same seed draws the same cases
  int64_t count = 100;  // cases to draw
  std::string device = "cpu";
  std::vector<std::string> kinds;  // empty: every kind the sampler knows
};

struct SampledCase {
  std::string toml;  // the case as a case file
  CaseSpec spec;     // parsed and validated from `toml`
};

struct SampleDraw {
  std::vector<SampledCase> cases;
  int64_t rejected = 0;  // draws the loader refused (a shape rule), redrawn
};

// The kinds the sampler draws: those that declare a draw (KindDecl::sample), in the registry's
// order.
std::vector<std::string> sampled_kinds();

// Draws `count` valid cases. Case i draws from its own stream (seed, "sample.<i>.<attempt>"),
// so a prefix of a longer draw is the shorter draw.
SampleDraw draw_cases(const SampleOptions& options);

}  // namespace gradscope

// What a selection of cases reaches of the case space: per kind, the values of each type axis,
// every pair of them, and the residues of token and feature counts around block sizes
// (docs/coverage.md). `gradscope coverage` prints it; CTest requires the smoke suite to miss
// nothing.
#pragma once

#include <cstdint>
#include <map>
#include <ostream>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "harness/spec/case_spec.h"

namespace gradscope {

struct AxisCoverage {
  std::string name;
  bool in_pairs = true;                    // part of the pairwise requirement
  std::map<std::string, int64_t> reached;  // value -> cases
  std::vector<std::string> missing;        // required values no case takes
};

// Counts modulo `modulus`: the residues reached and the required classes missed ("0", "1",
// "m-1", "between": a residue in 2..m-2; for features "0" and "not 0").
struct ResidueCoverage {
  int64_t modulus = 0;
  std::set<int64_t> reached;
  std::vector<std::string> missing;
};

struct MissingPair {
  std::string axis_a, value_a, axis_b, value_b;
};

struct KindCoverage {
  std::string kind;
  int64_t cases = 0;
  bool has_requirements = false;
  std::vector<AxisCoverage> axes;
  std::set<int64_t> token_counts;
  std::vector<ResidueCoverage> token_residues;
  std::set<int64_t> feature_counts;
  std::vector<ResidueCoverage> feature_residues;
  int64_t pairs_required = 0;
  std::vector<MissingPair> missing_pairs;
  // Every required value, residue class and pair the cases miss, as one line each.
  std::vector<std::string> missing() const;
};

struct CoverageReport {
  int64_t cases = 0;
  std::vector<KindCoverage> kinds;  // in kind order
  int64_t missing() const;
};

CoverageReport measure_coverage(const std::vector<CaseSpec>& cases);
void print_coverage(std::ostream& out, const CoverageReport& report);
nlohmann::ordered_json coverage_json(const CoverageReport& report);

}  // namespace gradscope

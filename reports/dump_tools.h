// `gradscope show` and `gradscope diff`: readers of HDF5 dumps.
#pragma once

#include <nlohmann/json.hpp>

#include <optional>
#include <ostream>
#include <string>

#include "reports/hdf5_dump.h"

namespace gradscope::report {

// The tree of a dump with dtype, shape and summary statistics; with `path`, only the
// group or dataset there (DumpError if nothing is).
void show_dump(std::ostream& out, const Dump& dump, const std::string& file,
               const std::string& path = "");

struct DiffOptions {
  std::optional<double> rtol, atol;  // default: torch.testing's pair for each dtype
};

struct DiffResult {
  int64_t tensors = 0;
  int64_t differing = 0;
  nlohmann::ordered_json json;
};

// Matches datasets by path and prints case by case, check by check: max and mean absolute
// difference, relative Frobenius error, status (allclose: |a - b| <= atol + rtol |b|).
// Throws DumpError when the two dumps hold different cases or datasets (it says which
// paths exist on one side only).
DiffResult diff_dumps(std::ostream& out, const Dump& a, const std::string& a_file, const Dump& b,
                      const std::string& b_file, const DiffOptions& options);

}  // namespace gradscope::report

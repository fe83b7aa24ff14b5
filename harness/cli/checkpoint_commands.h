// The checkpoint side of the command line: case specs for `run --checkpoint`, and the
// `dequant` and `export` commands. Errors are InputErrors (exit 2).
#pragma once

#include <ostream>
#include <string>
#include <vector>

#include "harness/checkpoint/checkpoint_reader.h"
#include "harness/checkpoint/checkpoint_writer.h"
#include "harness/spec/case_spec.h"

namespace gradscope {

struct CheckpointSelection {
  std::string dir;
  std::vector<int64_t> layers;           // empty: layer 0
  std::vector<std::string> projections;  // empty: all seven
};

// One case per kind a selected projection needs (qkv for q/k/v, lora_w for o_proj, mlp
// for gate/up/down) and layer, with the checkpoint's shapes and quantization; every
// module they use is loaded and checked first.
std::vector<CaseSpec> checkpoint_cases(const CheckpointSelection& selection);

// Writes W [out_features, in_features] (fp32) and the decoded codes, zero points, scales
// and g_idx of one module to an HDF5 file; prints summary statistics.
int command_dequant(std::ostream& out, const std::string& dir, const std::string& module,
                    const std::string& path);

int command_export(std::ostream& out, const ExportOptions& options);

}  // namespace gradscope

// HDF5 dumps of a run (`gradscope run --dump FILE.h5`) and the reader that `show` and
// `diff` use. The layout is documented in docs/reports.md.
#pragma once

#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "reports/report_types.h"

namespace gradscope::report {

// A file that cannot be read as a gradscope dump; the message names the file.
struct DumpError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct DumpOptions {
  bool failing_only = false;    // only cases that failed
  bool gradients_only = false;  // only checks of gradients (paths ending in ".grad"), no inputs
};

// A dump written case by case: add_case() puts a case's tensors into the file as soon as the
// case ends, so the caller can drop them (a run holds one case's tensors, not the run's);
// finish() adds the run's attributes and moves the file into place. Destroyed unfinished (an
// error), it leaves nothing behind. Identical runs give identical bytes: HDF5 object
// timestamps are switched off.
class DumpWriter {
 public:
  DumpWriter(const std::string& path, const DumpOptions& options);
  ~DumpWriter();
  DumpWriter(const DumpWriter&) = delete;
  DumpWriter& operator=(const DumpWriter&) = delete;

  void add_case(const CaseResult& c);
  void finish(const RunReport& report);

 private:
  struct State;
  std::unique_ptr<State> state_;
};

// The same for a finished report, in one call.
void write_dump(const std::string& path, const RunReport& report, const DumpOptions& options);

// Named arrays at the root of a new HDF5 file (string attributes on the root), for
// offline analysis with h5py, e.g. `gradscope dequant --out W.h5`. Atomic like write_dump.
void write_arrays(const std::string& path, const std::map<std::string, std::string>& attributes,
                  const std::vector<std::pair<std::string, TensorData>>& datasets);

struct DumpDataset {
  std::string path;   // "/<case id>/layer0/mlp/gate_proj/lora_A.grad/prod"
  std::string dtype;  // the original dtype (attribute "dtype")
  std::vector<int64_t> shape;
  std::vector<double> values;
};

struct Dump {
  std::map<std::string, std::string> attributes;  // root attributes
  std::vector<std::string> cases;                 // case ids, sorted
  std::vector<DumpDataset> datasets;              // sorted by path
  // Attributes of every group, by group path ("/" for the root).
  std::map<std::string, std::map<std::string, std::string>> group_attributes;
};

// The reader's bounds (docs/reports.md): a file past any of them is refused, so that reading
// ends in bounded time on any input. A dump written by gradscope nests at most six groups
// (case, layer, module, projection, tensor, dataset) and holds a few objects per check.
inline constexpr int kMaxDumpDepth = 32;
inline constexpr size_t kMaxDumpObjects = 1000000;

// Throws DumpError for a missing, unreadable, truncated or non-HDF5 file, one whose root does
// not say format = "gradscope-dump", or one past the bounds above: a group that links back to
// one of its ancestors, an object reached by two links, soft or external links.
Dump read_dump(const std::string& path);

inline constexpr const char* kDumpFormat = "gradscope-dump";
inline constexpr int kDumpSchemaVersion = 1;

}  // namespace gradscope::report

// libFuzzer target: bytes as an HDF5 dump through read_dump and `show`. A file that is
// not a readable gradscope dump must end in a DumpError; a crash is a finding.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <sstream>
#include <string>

#include "fuzz_scratch.h"
#include "reports/dump_tools.h"
#include "reports/hdf5_dump.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // HDF5 reads files, not memory: one scratch file per process, rewritten per input.
  static const std::string path = gradscope::fuzzing::scratch_path("dump", ".h5");
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) return 0;
  std::fwrite(data, 1, size, f);
  std::fclose(f);
  try {
    const auto dump = gradscope::report::read_dump(path);
    std::ostringstream out;
    gradscope::report::show_dump(out, dump, path, "");
  } catch (const gradscope::report::DumpError&) {
  }
  return 0;
}

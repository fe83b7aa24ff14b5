// libFuzzer target: bytes as a safetensors file through the header parser. A bad file
// must end in an InputError; a crash, a hang or a huge allocation is a finding. Every
// tensor it accepts must lie inside the buffer.
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "harness/checkpoint/safetensors_file.h"
#include "harness/common/input_error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const auto header = gradscope::safetensors::parse_header(data, size, "fuzz.safetensors");
    for (const auto& t : header.tensors) {
      if (header.data_offset + t.end > size || t.begin > t.end) std::abort();
    }
  } catch (const gradscope::InputError&) {
  }
  return 0;
}

// libFuzzer target: bytes as a checkpoint's quantize_config.json and config.json, through the
// readers of the quantization config and the model's dimensions. An input holding the line
// "---" is a pair (quantize_config.json before it, config.json after: two configs that may
// disagree); any other input is both files. A file they cannot use must end in an InputError
// naming it; any other exception or a crash is a finding.
#include <sys/stat.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>

#include "fuzz_scratch.h"
#include "harness/checkpoint/gptq_config.h"
#include "harness/common/input_error.h"

namespace {

void write(const std::string& path, const uint8_t* data, size_t size) {
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) return;
  std::fwrite(data, 1, size, f);
  std::fclose(f);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // A scratch checkpoint folder per process; both files get the input.
  static const std::string dir = [] {
    const std::string d = gradscope::fuzzing::scratch_path("config");
    ::mkdir(d.c_str(), 0700);
    return d;
  }();
  const std::string text(reinterpret_cast<const char*>(data), size);
  const auto split = text.find("\n---\n");
  if (split == std::string::npos) {
    write(dir + "/quantize_config.json", data, size);
    write(dir + "/config.json", data, size);
  } else {
    write(dir + "/quantize_config.json", data, split);
    write(dir + "/config.json", data + split + 5, size - split - 5);
  }
  try {
    gradscope::read_quantize_config(dir);
  } catch (const gradscope::InputError&) {
  }
  try {
    gradscope::read_model_dims(dir);
  } catch (const gradscope::InputError&) {
  }
  return 0;
}

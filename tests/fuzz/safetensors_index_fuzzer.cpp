// libFuzzer target: bytes as a sharded checkpoint's model.safetensors.index.json, beside the
// real shards and configs of tests/data/tiny-gptq-v2-3bit-sharded, through the checkpoint
// reader: its modules are listed and each is loaded. An index it cannot use must end in an
// InputError naming it; any other exception, a crash or a hang is a finding.
#include <sys/stat.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>

#include "fuzz_scratch.h"
#include "harness/checkpoint/checkpoint_reader.h"
#include "harness/common/input_error.h"

namespace {

const char* kFiles[] = {"config.json", "quantize_config.json", "model-00001-of-00002.safetensors",
                        "model-00002-of-00002.safetensors"};

// A scratch checkpoint per process: links to the committed files, and the index written anew.
std::string scratch_checkpoint() {
  const std::string dir = gradscope::fuzzing::scratch_path("index");
  ::mkdir(dir.c_str(), 0700);
  for (const char* f : kFiles) {
    const std::string source =
        std::string(GRADSCOPE_TEST_DATA_DIR) + "/tiny-gptq-v2-3bit-sharded/" + f;
    ::symlink(source.c_str(), (dir + "/" + f).c_str());
  }
  return dir;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string dir = scratch_checkpoint();
  const std::string index = dir + "/model.safetensors.index.json";
  if (FILE* f = std::fopen(index.c_str(), "wb")) {
    std::fwrite(data, 1, size, f);
    std::fclose(f);
  }
  try {
    const gradscope::GptqCheckpoint checkpoint(dir);
    for (const auto& module : checkpoint.modules()) checkpoint.load(module);
  } catch (const gradscope::InputError&) {
  }
  return 0;
}

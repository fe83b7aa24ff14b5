// The LoRA kinds (lora_w, qkv, mlp) end to end through the CLI: clean kernels pass, and each fault
// switch makes the run fail naming the tensor the fault corrupts.
#include <gtest/gtest.h>

#include "cli_capture.h"
#include "gradscope/faults.h"
#include "harness/cli/cli.h"
#include "test_files.h"

namespace gradscope {
namespace {

const char* kCases = R"(kind = "lora_w"
in_features = 128
out_features = 64
dtype = "bf16"
dropout = 0.1
)";

const char* kMlp = R"(kind = "mlp"
hidden = 64
intermediate = 96
dtype = "fp16"
dropout = 0.1
)";

using testing::run_captured;

TEST(LoraKinds, CleanKernelsPass) {
  testing::TempDir dir;
  const auto r = run_captured({"run", dir.write("w.toml", kCases), dir.write("m.toml", kMlp)});
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("o_proj/lora_A.grad"), std::string::npos) << r.out;  // the table
}

TEST(LoraKinds, MissingDropoutRescaleFailsOnInputGrad) {
  testing::TempDir dir;
  if (!fault_switches_linked()) GTEST_SKIP() << "built without fault switches";
  const ScopedFault fault(Fault::kDropoutRescaleMissing);
  const auto r = run_captured({"run", dir.write("w.toml", kCases), "--quiet"});
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("layer0/self_attn/o_proj/input.grad: |prod - ref|"), std::string::npos)
      << r.out;
  EXPECT_EQ(r.out.find("lora_A.grad: |prod - ref|"), std::string::npos) << r.out;
}

TEST(LoraKinds, MissingScaleInDAFailsOnLoraAGrad) {
  testing::TempDir dir;
  if (!fault_switches_linked()) GTEST_SKIP() << "built without fault switches";
  const ScopedFault fault(Fault::kLoraScaleMissingInDA);
  const auto r =
      run_captured({"run", dir.write("w.toml", kCases), dir.write("m.toml", kMlp), "--quiet"});
  EXPECT_EQ(r.code, 1) << r.out;
  for (const char* path :
       {"o_proj/lora_A.grad: |prod - ref|", "gate_proj/lora_A.grad: |prod - ref|",
        "up_proj/lora_A.grad: |prod - ref|", "down_proj/lora_A.grad: |prod - ref|"}) {
    EXPECT_NE(r.out.find(path), std::string::npos) << path << "\n" << r.out;
  }
  EXPECT_EQ(r.out.find("lora_B.grad: |prod - ref|"), std::string::npos) << r.out;
}

TEST(LoraKinds, ImpossibleShapesAndRanges) {
  testing::TempDir dir;
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(run_cli({"run", dir.write("a.toml",
                                      "kind = \"qkv\"\nhidden = 256\nheads = 4\nkv_heads = 3\n")}),
            2);
  EXPECT_EQ(run_cli({"run", dir.write("b.toml", "kind = \"mlp\"\nbits = 3\nintermediate = 688\n")}),
            2);
  EXPECT_EQ(run_cli({"run", dir.write("c.toml", "kind = \"lora_w\"\ndropout = 1.0\n")}), 2);
  EXPECT_EQ(run_cli({"run", dir.write("d.toml", "kind = \"lora_w\"\nrank = 0\n")}), 2);
  const auto err = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("kv_heads must divide heads 4"), std::string::npos) << err;
  EXPECT_NE(err.find("intermediate must be a multiple of 32 for 3-bit"), std::string::npos) << err;
  EXPECT_NE(err.find("dropout must be below 1"), std::string::npos) << err;
  EXPECT_NE(err.find("key 'rank' is 0"), std::string::npos) << err;
}

}  // namespace
}  // namespace gradscope

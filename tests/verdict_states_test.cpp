// The verdict states end to end through the CLI (docs/verification.md): a result the formats
// cannot hold is invalid (exit 2), an overflowing baseline leaves prod to the floor, prod's
// scaling and output dtype are its own and are judged.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <fstream>
#include <map>

#include "cli_capture.h"
#include "gradscope/faults.h"
#include "harness/cli/cli.h"
#include "test_files.h"

namespace gradscope {
namespace {

using testing::run_captured;

nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in);
}

// The case file `path` with its text `field` (which must be there) replaced by `with`, written
// into `dir` as `name`.
std::string with_field(testing::TempDir& dir, const std::string& path, const std::string& name,
                       const std::string& field, const std::string& with) {
  std::string text = testing::read_file(path);
  const auto at = text.find(field);
  EXPECT_NE(at, std::string::npos) << path << " has no \"" << field << "\"";
  if (at == std::string::npos) return path;
  return dir.write(name, text.replace(at, field.size(), with));
}

const nlohmann::json* find_check(const nlohmann::json& report, const std::string& suffix) {
  for (const auto& c : report["cases"]) {
    for (const auto& check : c["checks"]) {
      const std::string path = check["path"];
      if (path.size() >= suffix.size() &&
          path.compare(path.size() - suffix.size(), suffix.size(), suffix) == 0) {
        return &check;
      }
    }
  }
  return nullptr;
}

// fp16 activations, fp32 adapters, 4096 tokens, scaling 256: the sum over tokens takes some of
// the true lora_A.grad past fp16's 65504 while the output and input.grad stay well inside it
// (64 features keep the case small). Prod and the baseline keep the adapter path in fp32, as
// peft does; rounding it to fp16 overflows.
TEST(Verdicts, AdapterGradientsBeyondFp16PassWhenProdKeepsThemInFp32) {
  testing::TempDir dir;
  const auto file = dir.write("w.toml", R"(kind = "lora_w"
dtype = "fp16"
in_features = 64
out_features = 64
rank = 2
alpha = 512.0
batch = 4
seq = 1024
seed = 3
)");
  const auto r = run_captured({"run", file, "--quiet", "--json", dir.path("r.json")});
  EXPECT_EQ(r.code, 0) << r.out;
  const auto report = read_json(dir.path("r.json"));
  const auto* da = find_check(report, "o_proj/lora_A.grad");
  ASSERT_NE(da, nullptr);
  EXPECT_EQ((*da)["status"], "pass");
  EXPECT_TRUE((*da)["max_abs"].is_number()) << *da;           // finite: JSON has no inf
  EXPECT_TRUE((*da)["baseline_max_abs"].is_number()) << *da;  // base in fp32 adapters: finite
  EXPECT_EQ((*da)["note"], "") << (*da)["note"];
  // The fault that rounds the adapter path to fp16 (the former behaviour) overflows: a failure.
  if (!fault_switches_linked()) GTEST_SKIP() << "built without fault switches";
  const ScopedFault fault(Fault::kAdapterPathInActivationDtype);
  const auto bad = run_captured({"run", file, "--quiet"});
  EXPECT_EQ(bad.code, 1) << bad.out;
  EXPECT_NE(bad.out.find("o_proj/lora_A.grad: prod has"), std::string::npos) << bad.out;
  EXPECT_NE(bad.out.find("the exact result is finite and within fp32 range"), std::string::npos)
      << bad.out;
}

TEST(Verdicts, AnOutputBeyondItsDtypeIsInvalidNotAFailure) {
  testing::TempDir dir;
  const auto r = run_captured({"run", dir.write("w.toml", R"(kind = "lora_w"
dtype = "fp16"
rank = 1
alpha = 1000000.0
)")});
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("INVALID  lora_w.fp16"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("o_proj/output: out of range for fp16: the exact value reaches |ref| = "),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("beyond fp16's largest finite value 65504"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("1 invalid (not judged)"), std::string::npos) << r.out;
}

TEST(Verdicts, AnInputBeyondItsDtypeIsInvalid) {
  testing::TempDir dir;
  const auto r = run_captured({"run", dir.write("w.toml", R"(kind = "lora_w"
dtype = "fp16"
loss_scale = 1000000.0
)")});
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("input dy reaches |dy| = "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("out of range for its dtype"), std::string::npos) << r.out;
}

// The judges derive rsLoRA's scaling from the case; prod takes it from the production
// library. A wrong formula there moves prod alone, and the gate sees it.
TEST(Verdicts, AWrongScalingFormulaInTheLibraryFails) {
  testing::TempDir dir;
  const auto file = dir.write("w.toml", R"(kind = "lora_w"
dtype = "fp32"
rslora = true
rank = 16
)");
  EXPECT_EQ(run_captured({"run", file, "--quiet"}).code, 0);
  if (!fault_switches_linked()) GTEST_SKIP() << "built without fault switches";
  const ScopedFault fault(Fault::kLoraScalingIgnoresRslora);
  const auto r = run_captured({"run", file, "--quiet"});
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("o_proj/output: |prod - ref|"), std::string::npos) << r.out;
}

TEST(Verdicts, AnOutputInTheWrongDtypeFails) {
  testing::TempDir dir;
  if (!fault_switches_linked()) GTEST_SKIP() << "built without fault switches";
  const ScopedFault fault(Fault::kLoraOutputFloat32);
  const auto r = run_captured(
      {"run", dir.write("w.toml", "kind = \"lora_w\"\ndtype = \"bf16\"\n"), "--quiet"});
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("o_proj/output: the values for attribute 'dtype' do not match: prod is "
                       "fp32, expected bf16"),
            std::string::npos)
      << r.out;
}

// tests/data/layer-backward-sum-overflows.toml: the sum of two projections' input gradients
// that a careful fp16 implementation holds in fp16 (each share in range, the sum not) overflows,
// and prod's and the baseline's input gradients are NaN. The floor's model records that sum, so
// the case is out of range, not a false alarm (sample 5 of `gradscope sample --seed 424242`);
// with a smaller loss scale the layer is judged and passes.
TEST(Verdicts, ABackwardSumACarefulImplementationOverflowsIsOutOfRange) {
  testing::TempDir dir;
  const std::string file =
      std::string(GRADSCOPE_TEST_DATA_DIR) + "/layer-backward-sum-overflows.toml";
  const auto r = run_captured({"run", file, "--quiet"});
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("a careful implementation overflows too (its "
                       "layer0/post_attention_norm.grad reaches "),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find(" 0 failed, "), std::string::npos) << r.out;
  const auto calm =
      with_field(dir, file, "calm.toml", "loss_scale = 1024.0\n", "loss_scale = 1.0\n");
  EXPECT_EQ(run_captured({"run", calm, "--quiet"}).code, 0);
}

// tests/data/attention-past-the-model.toml: rsLoRA's scaling 67 at rank 2 drives both layers'
// attention scores to thousands, which bf16 holds to within units: softmax's exponent then moves
// by far more than the floor's first order covers, and correct kernels drew a false alarm here
// (sample 390 of `gradscope sample --seed 17`). Every check of such a layer is reported and not
// judged; the same layers with a modest scaling are judged.
TEST(Verdicts, AnAttentionPastTheFloorsModelIsNotJudged) {
  testing::TempDir dir;
  const std::string ill = std::string(GRADSCOPE_TEST_DATA_DIR) + "/attention-past-the-model.toml";
  const auto r = run_captured({"run", ill, "--json", dir.path("ill.json")});
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("/layer1/hidden/input.grad: cannot be judged: layer 1's attention is past "
                       "the floor's model: a careful bf16 implementation's score at batch "),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("0 failed, 1 invalid"), std::string::npos) << r.out;
  const auto report = read_json(dir.path("ill.json"));
  int64_t checks = 0;
  for (const auto& c : report["cases"][0]["checks"]) {
    EXPECT_EQ(c["status"], "out_of_range") << c["path"];
    EXPECT_TRUE(c["max_abs"].is_number()) << c["path"];  // the figures are still reported
    ++checks;
  }
  EXPECT_EQ(checks, 32);
  const auto modest =
      with_field(dir, ill, "modest.toml", "alpha = 94.5\nrslora = true\n", "alpha = 4.0\n");
  const auto m = run_captured({"run", modest, "--quiet"});
  EXPECT_EQ(m.code, 0) << m.out;
  EXPECT_NE(m.out.find("checks: 32 passed, 0 failed"), std::string::npos) << m.out;
  // A failing case beside one not judged: exit 1, a verdict on prod outranks no verdict.
  if (!fault_switches_linked()) GTEST_SKIP() << "built without fault switches";
  const ScopedFault fault(Fault::kDxMissingAdapterTerm);
  const auto both =
      run_captured({"run", ill, dir.write("w.toml", "kind = \"lora_w\"\n"), "--quiet"});
  EXPECT_EQ(both.code, 1) << both.out;
  EXPECT_NE(both.out.find("0 passed, 1 failed, 1 invalid (not judged)\n"), std::string::npos)
      << both.out;
  // --fail-fast stops at a failure, not at a case not judged.
  const auto fast = run_captured({"run", ill, dir.path("w.toml"), "--quiet", "--fail-fast"});
  EXPECT_EQ(fast.code, 1) << fast.out;
  EXPECT_EQ(fast.out.find("--fail-fast: stopped"), std::string::npos) << fast.out;
}

// One layer past the model and one within it (sample 229 at seed 2026: sigma 17.8 and 0.66):
// layer 0 is not judged, layer 1 is; and a fault there fails the case, not judged or not.
TEST(Verdicts, OnlyTheLayerPastTheFloorsModelIsNotJudged) {
  testing::TempDir dir;
  const auto file = dir.write("mixed.toml", R"(kind = "layer"
seed = 546726
dtype = "bf16"
bits = 2
group_size = -1
desc_act = true
static_groups = true
sym = false
format = "gptq"
hidden = 64
heads = 2
kv_heads = 1
intermediate = 176
rank = 1
alpha = 27.75
adapter_dtype = "bf16"
batch = 4
seq = 24
loss_scale = 65536.0
)");
  const auto r = run_captured({"run", file, "--quiet", "--json", dir.path("r.json")});
  EXPECT_EQ(r.code, 2) << r.out;
  const auto report = read_json(dir.path("r.json"));
  std::map<std::string, int> statuses;
  for (const auto& c : report["cases"][0]["checks"]) {
    const std::string path = c["path"];
    const bool layer0 = path.find("/layer0/") != std::string::npos;
    ++statuses[(layer0 ? "layer0 " : "layer1 ") + c["status"].get<std::string>()];
  }
  EXPECT_EQ(statuses,
            (std::map<std::string, int>{{"layer0 out_of_range", 16}, {"layer1 pass", 16}}));
  if (!fault_switches_linked()) GTEST_SKIP() << "built without fault switches";
  const ScopedFault fault(Fault::kDxMissingAdapterTerm);
  const auto bad = run_captured({"run", file, "--quiet"});
  EXPECT_EQ(bad.code, 1) << bad.out;
  EXPECT_NE(bad.out.find("FAIL  layer.bf16"), std::string::npos) << bad.out;
  EXPECT_NE(bad.out.find("/layer1/mlp/gate_proj/lora_A.grad: |prod - ref|"), std::string::npos)
      << bad.out;
}

// A training step's token losses run through the same attention: scaling 102.5 at rank 1 puts
// its scores in the thousands, and each step's gated losses are reported, not judged; the
// exact checks (adapters untouched by a backward, frozen weights) still are.
TEST(Verdicts, ATrainingStepPastTheFloorsModelIsNotJudged) {
  testing::TempDir dir;
  const std::string fields = R"(kind = "training"
seed = 784437
dtype = "bf16"
bits = 8
hidden = 64
heads = 2
kv_heads = 1
intermediate = 96
layers = 1
vocab = 16
steps = 2
rank = 1
batch = 1
seq = 48
profile = "realistic"
)";
  const auto r = run_captured({"run", dir.write("ill.toml", fields + "alpha = 102.5\n")});
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("/step1/loss/token_loss: cannot be judged: step 1: layer 0's attention is "
                       "past the floor's model"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("checks: 35 passed, 0 failed, 2 not judged"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("prod's loss stays in the band at every step"), std::string::npos)
      << r.out;  // a step not judged is no divergence
  const auto m = run_captured({"run", dir.write("modest.toml", fields + "alpha = 2.0\n")});
  EXPECT_EQ(m.code, 0) << m.out;
  // A fault the exact checks see fails the case beside the steps not judged.
  if (!fault_switches_linked()) GTEST_SKIP() << "built without fault switches";
  const ScopedFault fault(Fault::kZerosRewrittenInBackward);
  const auto bad = run_captured({"run", dir.path("ill.toml"), "--quiet"});
  EXPECT_EQ(bad.code, 1) << bad.out;
  EXPECT_NE(bad.out.find("/frozen/layer0/"), std::string::npos) << bad.out;
}

TEST(Verdicts, ProfilesAndPositionsAreCaseFields) {
  testing::TempDir dir;
  const auto r = run_captured({"run", dir.write("l.toml", R"(kind = "layer"
profile = "realistic"
position_offset = 5
)")});
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("position_offset must be 0 with profile realistic"), std::string::npos)
      << r.err;
  const auto one = run_captured({"run", dir.write("s.toml", "kind = \"layer\"\nseq = 1\n")});
  EXPECT_EQ(one.code, 2);
  EXPECT_NE(one.err.find("seq must be at least 2 for kind layer"), std::string::npos) << one.err;
}

}  // namespace
}  // namespace gradscope

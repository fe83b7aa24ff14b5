// The case engine's phases (harness/engine/case_kind.h): the judges (ref, floor) run beside the
// baseline (after prod) change no check of any kind that allows it, and the metrics come in the
// same order as when the phases run one after another.
#include <ATen/Context.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>

#include <string>
#include <vector>

#include "gradscope/dequant.h"
#include "harness/catalog/case_file.h"
#include "harness/catalog/kind_registry.h"
#include "harness/engine/case_kind.h"
#include "test_files.h"

namespace gradscope {
namespace {

// One small case of every kind whose judges may run beside its implementations, with dropout
// where the kind has it (the masks are state both sides read).
const char* kEngineCases[] = {
    "kind = \"dequant\"\nin_features = 256\nout_features = 64\nbits = 3\ndesc_act = true\n",
    "kind = \"lora_w\"\nin_features = 128\nout_features = 64\ndtype = \"bf16\"\ndropout = 0.1\n",
    "kind = \"qkv\"\nhidden = 128\nheads = 4\nkv_heads = 1\nseq = 17\ndtype = \"fp16\"\n"
    "dropout = 0.1\n",
    "kind = \"mlp\"\nhidden = 64\nintermediate = 96\ndtype = \"fp16\"\ndropout = 0.1\n",
    "kind = \"fsdp\"\nworld_size = 2\nsharding = \"per_param\"\n",
    // Two layers: the second's input and output gradient come from the reference's stack.
    "kind = \"layer\"\nhidden = 64\nintermediate = 96\nheads = 4\nkv_heads = 2\nlayers = 2\n"
    "seq = 9\ndtype = \"bf16\"\n",
};

CaseResult run_one(const CaseSpec& spec, const std::string& id, bool overlap) {
  RunOptions options;
  options.overlap_judges = overlap;
  return find_kind(spec.kind)->run(spec, id, options);
}

std::vector<std::string> metric_names(const CaseResult& r) {
  std::vector<std::string> names;
  for (const auto& [name, value] : r.metrics) {
    if (name.find(".seconds") != std::string::npos) names.push_back(name);
  }
  return names;
}

TEST(CaseEngine, JudgesBesideTheImplementationsChangeNoCheck) {
  testing::TempDir dir;
  int file = 0;
  for (const char* text : kEngineCases) {
    const auto specs = load_case_file(dir.write("c" + std::to_string(file++) + ".toml", text));
    ASSERT_EQ(specs.size(), 1u) << text;
    const auto& spec = specs[0];
    const std::string id = find_kind(spec.kind)->case_id(spec);
    const CaseResult apart = run_one(spec, id, false), beside = run_one(spec, id, true);
    ASSERT_EQ(apart.checks.size(), beside.checks.size()) << id;
    ASSERT_FALSE(apart.checks.empty()) << id;
    for (size_t i = 0; i < apart.checks.size(); ++i) {
      const auto &a = apart.checks[i], &b = beside.checks[i];
      EXPECT_EQ(a.path, b.path);
      EXPECT_STREQ(a.status(), b.status()) << a.path;
      EXPECT_EQ(a.max_abs, b.max_abs) << a.path;
      EXPECT_EQ(a.limit, b.limit) << a.path;
      EXPECT_EQ(a.floor, b.floor) << a.path;
      EXPECT_EQ(a.baseline_max_abs, b.baseline_max_abs) << a.path;
      EXPECT_EQ(a.failure, b.failure) << a.path;
    }
    EXPECT_EQ(metric_names(apart), metric_names(beside)) << id;
  }
}

// The floor's products of squares on the case's GPU (harness/engine/judge_device.h): a CUDA
// case whose base products are worth the device (m, n and k distinct), against the same case
// with the floor on the host. The implementations' errors are the same computation; each floor
// moves by at most the fp32 products' bound (k + 3) 2^-24, halved by its square root, and no status
// changes.
TEST(CaseEngine, FloorProductsOnTheGpuChangeNoVerdict) {
  if (!built_with_cuda() || !at::hasCUDA()) {
    if (std::getenv("GRADSCOPE_REQUIRE_CUDA") != nullptr) FAIL() << "no CUDA GPU or CUDA build";
    GTEST_SKIP() << "needs a CUDA GPU";
  }
  testing::TempDir dir;
  const auto specs = load_case_file(
      dir.write("gpu.toml",
                "kind = \"lora_w\"\nin_features = 1792\nout_features = 2560\nbatch = 2\n"
                "seq = 1000\ndtype = \"bf16\"\ndevice = \"cuda\"\nrank = 16\n"));
  ASSERT_EQ(specs.size(), 1u);
  const auto& spec = specs[0];
  const std::string id = find_kind(spec.kind)->case_id(spec);
  RunOptions on_gpu, on_host;
  on_host.floor_on_host = true;
  const CaseResult gpu = find_kind(spec.kind)->run(spec, id, on_gpu);
  const CaseResult host = find_kind(spec.kind)->run(spec, id, on_host);
  double products = -1;
  for (const auto& [name, value] : gpu.metrics) {
    if (name == "floor.gpu_products") products = value;
  }
  for (const auto& [name, value] : host.metrics) EXPECT_NE(name, "floor.gpu_products");
  // x^2 W^2 forward, dY^2 (W^2)^T backward.
  EXPECT_GE(products, 2) << "the base products did not reach the GPU";
  ASSERT_EQ(gpu.checks.size(), host.checks.size());
  const double bound = (2560 + 3) * std::ldexp(1.0, -24);
  for (size_t i = 0; i < gpu.checks.size(); ++i) {
    const auto &g = gpu.checks[i], &h = host.checks[i];
    EXPECT_EQ(g.path, h.path);
    EXPECT_STREQ(g.status(), h.status()) << g.path;
    ASSERT_EQ(g.floor.has_value(), h.floor.has_value()) << g.path;
    if (h.floor) {
      EXPECT_LE(std::abs(*g.floor - *h.floor), bound * *h.floor) << g.path;
    }
  }
}

}  // namespace
}  // namespace gradscope

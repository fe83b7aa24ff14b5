// Reports through the CLI: dumps that diff clean against themselves, a dump of a faulty
// kernel that differs on the right tensors, show, JUnit, and the regression gate.
#include <gtest/gtest.h>

#include <fstream>
#include <iterator>

#include "cli_capture.h"
#include "gradscope/faults.h"
#include "harness/cli/cli.h"
#include "harness/common/file_system.h"
#include "test_files.h"

namespace gradscope {
namespace {

const char* kCase = R"(kind = "lora_w"
in_features = 64
out_features = 32
dtype = "bf16"
dropout = 0.1
)";

const auto cli = testing::run_captured;

std::string bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

TEST(ReportCli, DumpsOfTheSameRunAreIdenticalAndDiffClean) {
  testing::TempDir dir;
  const auto c = dir.write("c.toml", kCase);
  ASSERT_EQ(cli({"run", c, "--dump", dir.path("a.h5"), "--quiet"}).code, 0);
  ASSERT_EQ(cli({"run", c, "--dump", dir.path("b.h5"), "--quiet"}).code, 0);
  EXPECT_EQ(bytes(dir.path("a.h5")), bytes(dir.path("b.h5")));
  const auto d = cli({"diff", dir.path("a.h5"), dir.path("b.h5"), "--json", dir.path("d.json")});
  EXPECT_EQ(d.code, 0) << d.out << d.err;
  EXPECT_TRUE(files::is_regular_file(dir.path("d.json")));
  const auto s = cli({"show", dir.path("a.h5")});
  EXPECT_EQ(s.code, 0) << s.err;
  EXPECT_NE(s.out.find("layer0/self_attn/o_proj/lora_A.grad"), std::string::npos) << s.out;
  EXPECT_NE(s.out.find("inputs"), std::string::npos);
}

TEST(ReportCli, AFaultyKernelsDumpDiffersOnTheTensorsItCorrupts) {
  testing::TempDir dir;
  const auto c = dir.write("c.toml", kCase);
  ASSERT_EQ(cli({"run", c, "--dump", dir.path("clean.h5"), "--quiet"}).code, 0);
  {
    if (!fault_switches_linked()) GTEST_SKIP() << "built without fault switches";
    const ScopedFault fault(Fault::kLoraScaleMissingInDA);
    EXPECT_EQ(cli({"run", c, "--dump", dir.path("faulty.h5"), "--quiet"}).code, 1);
  }
  const auto d = cli({"diff", dir.path("clean.h5"), dir.path("faulty.h5")});
  EXPECT_EQ(d.code, 1) << d.out;
  const auto grad = d.out.find("o_proj/lora_A.grad\n");
  ASSERT_NE(grad, std::string::npos) << d.out;
  const auto prod = d.out.find("    prod ", grad);
  EXPECT_EQ(d.out.find("DIFFERS"), d.out.find("DIFFERS", prod)) << d.out;  // the first and only
  EXPECT_NE(d.out.find("1 differ"), std::string::npos) << d.out;  // only lora_A.grad's prod
}

TEST(ReportCli, BadDumpsExitTwoNamingTheFile) {
  testing::TempDir dir;
  const auto text = dir.write("t.h5", "text");
  for (const auto& args : std::vector<std::vector<std::string>>{
           {"show", dir.path("missing.h5")},
           {"show", text},
           {"diff", text, text},
           {"diff", dir.path("a.h5"), dir.path("b.h5"), "--rtol", "0.1"}}) {
    const auto r = cli(args);
    EXPECT_EQ(r.code, 2) << args[0] << " " << args[1] << "\n" << r.err;
  }
  EXPECT_NE(cli({"show", text}).err.find("t.h5: not an HDF5 file"), std::string::npos);
}

TEST(ReportCli, JUnitFileHasATestcasePerCheck) {
  testing::TempDir dir;
  ASSERT_EQ(cli({"run", dir.write("c.toml", kCase), "--junit", dir.path("j.xml"), "--quiet"}).code,
            0);
  const auto xml = bytes(dir.path("j.xml"));
  EXPECT_NE(xml.find("<testsuites name=\"gradscope\" tests=\"4\" failures=\"0\""),
            std::string::npos)
      << xml;
  EXPECT_NE(xml.find("name=\"layer0/self_attn/o_proj/input.grad\""), std::string::npos);
}

TEST(ReportCli, RegressionGateAgainstAnAcceptedReport) {
  testing::TempDir dir;
  const auto c = dir.write("c.toml", kCase);
  ASSERT_EQ(cli({"run", c, "--json", dir.path("accepted.json"), "--quiet"}).code, 0);
  const auto same = cli({"run", c, "--against", dir.path("accepted.json"), "--quiet"});
  EXPECT_EQ(same.code, 0) << same.out;
  EXPECT_NE(same.out.find("no regressions"), std::string::npos);
  {
    if (!fault_switches_linked()) GTEST_SKIP() << "built without fault switches";
    const ScopedFault fault(Fault::kDropoutRescaleMissing);
    const auto worse = cli({"run", c, "--against", dir.path("accepted.json"), "--quiet"});
    EXPECT_EQ(worse.code, 1);
    EXPECT_NE(worse.out.find("o_proj/input.grad"), std::string::npos) << worse.out;
    EXPECT_NE(worse.out.find("now failing"), std::string::npos) << worse.out;
  }
  const auto other = dir.write("o.toml", std::string(kCase) + "seed = 5\n");
  const auto renamed = cli({"run", other, "--against", dir.path("accepted.json"), "--quiet"});
  EXPECT_EQ(renamed.code, 1);
  EXPECT_NE(renamed.out.find("new check"), std::string::npos);
  // The accepted case was not run this time: its checks are named, not counted as missing.
  EXPECT_NE(renamed.out.find("not run"), std::string::npos) << renamed.out;
  EXPECT_EQ(renamed.out.find("missing"), std::string::npos) << renamed.out;
  EXPECT_EQ(cli({"run", c, "--against", dir.path("nope.json")}).code, 2);
  EXPECT_EQ(cli({"run", c, "--against", dir.write("bad.json", "{}")}).code, 2);
}

}  // namespace
}  // namespace gradscope

#include <nlohmann/json.hpp>

namespace gradscope {
namespace {

// Determinism: the same cases run twice give identical checks (every metric, worst index
// and message) and byte-identical dumps; only the wall-time metrics may differ.
TEST(ReportCli, RunsAreDeterministic) {
  testing::TempDir dir;
  const std::vector<std::string> cases = {
      std::string(GRADSCOPE_TEST_CASES_DIR) + "/smoke/mlp.toml",
      std::string(GRADSCOPE_TEST_CASES_DIR) + "/smoke/dequant_groups.toml"};
  for (const char* name : {"a", "b"}) {
    auto args = std::vector<std::string>{"run"};
    args.insert(args.end(), cases.begin(), cases.end());
    for (const char* extra : {"--filter", "*bf16*", "--quiet"}) args.push_back(extra);
    args.push_back("--json");
    args.push_back(dir.path(std::string(name) + ".json"));
    args.push_back("--dump");
    args.push_back(dir.path(std::string(name) + ".h5"));
    ASSERT_EQ(cli(args).code, 0);
  }
  const auto a = nlohmann::json::parse(bytes(dir.path("a.json")));
  const auto b = nlohmann::json::parse(bytes(dir.path("b.json")));
  ASSERT_EQ(a["cases"].size(), b["cases"].size());
  ASSERT_GT(a["cases"].size(), 10u);
  for (size_t i = 0; i < a["cases"].size(); ++i) {
    EXPECT_EQ(a["cases"][i]["checks"], b["cases"][i]["checks"]) << a["cases"][i]["id"];
  }
  EXPECT_EQ(bytes(dir.path("a.h5")), bytes(dir.path("b.h5")));
}

}  // namespace
}  // namespace gradscope

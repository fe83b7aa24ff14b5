#include <ATen/Context.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <fstream>
#include <sstream>

#include "cli_capture.h"
#include "harness/cli/cli.h"
#include "harness/cli/environment.h"
#include "harness/common/file_system.h"
#include "test_files.h"

namespace gradscope {
namespace {

using testing::TempDir;

const auto cli = testing::run_captured;

const char* kSmallCases = R"(kind = "dequant"
in_features = 64
out_features = 32
[matrix]
bits = [3, 4]
format = ["gptq", "gptq_v2"]
)";

TEST(Cli, RunPassesAndWritesTheJsonContract) {
  TempDir dir;
  const auto cases = dir.write("c.toml", kSmallCases);
  const auto json_path = dir.path("r.json");
  const auto r = cli({"run", cases, "--json", json_path});
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("4 passed, 0 failed"), std::string::npos) << r.out;
  std::ifstream in(json_path);
  const auto j = nlohmann::json::parse(in);
  EXPECT_EQ(j["tool"], "gradscope");
  for (const char* key : {"device", "gpu", "torch", "cuda", "compiler"}) {
    EXPECT_TRUE(j["environment"].contains(key)) << key;
  }
  EXPECT_EQ(j["summary"]["total"], 4);
  EXPECT_EQ(j["summary"]["passed"], 4);
  const auto& c = j["cases"][0];
  EXPECT_EQ(c["kind"], "dequant");
  EXPECT_EQ(c["status"], "pass");
  EXPECT_EQ(c["spec"]["bits"], 3);
  EXPECT_EQ(c["spec"]["format"], "gptq");
  EXPECT_EQ(c["spec"]["in_features"], 64);
  ASSERT_FALSE(c["checks"].empty());
  for (const auto& check : c["checks"]) {
    for (const char* key : {"path", "status", "max_abs", "mean_abs", "baseline_max_abs", "limit"}) {
      EXPECT_TRUE(check.contains(key)) << key;
    }
    EXPECT_TRUE(check["baseline_max_abs"].is_null());  // exact checks have no baseline
  }
}

TEST(Cli, OverridesAndFilterSelectCases) {
  TempDir dir;
  const auto cases = dir.write("c.toml", kSmallCases);
  const auto r = cli({"list", cases, "--dtype", "bf16", "--seed", "9", "--filter", "*b3*v2*"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, "dequant.bf16.k64n32.b3g128.v2.sym.s9\n");
}

TEST(Cli, BadInputExitsTwoAndNamesTheProblem) {
  TempDir dir;
  const auto bad = dir.write("bad.toml", "kind = \"dequant\"\nbits = [\n");
  const auto unknown_key = dir.write("k.toml", "kind = \"dequant\"\nbitz = 4\n");
  const auto shape = dir.write("s.toml", "kind = \"dequant\"\nbits = 3\nin_features = 40\n");
  const struct {
    std::vector<std::string> args;
    std::string expected;
  } cases[] = {
      {{"run", bad}, "malformed TOML"},
      {{"run", unknown_key}, "unknown key 'bitz'"},
      {{"run", shape}, "in_features must be a multiple of 32"},
      {{"run", dir.path("missing.toml")}, "case file not found"},
      {{"run", "--suite", "no-such-suite"}, "unknown suite 'no-such-suite'"},
      {{"run", "--device", "tpu"}, "--device"},
      {{"run", "--dtype", "fp64"}, "--dtype"},
      {{"run", "--seed", "-3"}, "--seed"},
      {{"run", "--bogus"}, "bogus"},
      {{}, "subcommand"},
      {{"list", shape + "x"}, "case file not found"},
      {{"run", dir.write("f.toml", kSmallCases), "--filter", "nothing*"}, "no case id matches"},
      // TOML has nan and inf literals; a case parameter must be a finite number.
      {{"run", dir.write("nan.toml", "kind = \"lora_w\"\nalpha = nan\n")},
       "key 'alpha' must be finite"},
      {{"run", dir.write("inf.toml", "kind = \"lora_w\"\n[matrix]\ndropout = [0.0, inf]\n")},
       "key 'dropout' must be finite"},
      {{"run", dir.write("ninf.toml", "kind = \"lora_w\"\nalpha = -inf\n")},
       "key 'alpha' must be finite"},
  };
  for (const auto& c : cases) {
    const auto r = cli(c.args);
    EXPECT_EQ(r.code, 2) << c.expected << "\n" << r.out << r.err;
    EXPECT_NE(r.err.find(c.expected), std::string::npos) << r.err;
  }
}

TEST(Cli, NoPartialJsonOnBadInputOrUnwritablePath) {
  TempDir dir;
  const auto json_path = dir.path("r.json");
  EXPECT_EQ(cli({"run", dir.path("missing.toml"), "--json", json_path}).code, 2);
  EXPECT_FALSE(files::is_regular_file(json_path));
  const auto r =
      cli({"run", dir.write("c.toml", kSmallCases), "--json", dir.path("no/such/dir/r.json")});
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("does not exist"), std::string::npos) << r.err;
  // No temporary files are left behind either.
  EXPECT_EQ(files::find_files(dir.path(), ""), std::vector<std::string>{dir.path("c.toml")});
}

// --device cuda either runs the CUDA kernels (where a GPU is usable) or is a usage error
// naming the problem; both outcomes are asserted, so the test means something everywhere.
TEST(Cli, DeviceCudaRunsOrIsAUsageError) {
  TempDir dir;
  const auto r = cli({"run", dir.write("c.toml", kSmallCases), "--device", "cuda"});
  if (cuda_usable()) {
    EXPECT_EQ(r.code, 0) << r.out << r.err;
    EXPECT_NE(r.out.find("4 passed, 0 failed"), std::string::npos) << r.out;
  } else {
    EXPECT_EQ(r.code, 2);
    EXPECT_NE(r.err.find("device 'cuda' requested"), std::string::npos) << r.err;
  }
}

// A run's deterministic algorithms last for the run: the process gets its own setting back (a
// Python process that calls gradscope.check goes on with it), nested scopes included.
TEST(Cli, DeterministicAlgorithmsLastForTheRun) {
  auto& context = at::globalContext();
  const bool was = context.deterministicAlgorithms();
  const bool was_warn_only = context.deterministicAlgorithmsWarnOnly();
  context.setDeterministicAlgorithms(false, false);
  {
    const CudaDeterminism strict(/*strict=*/true);
    EXPECT_TRUE(context.deterministicAlgorithms());
    EXPECT_FALSE(context.deterministicAlgorithmsWarnOnly());
    {
      const CudaDeterminism warn_only(/*strict=*/false);
      EXPECT_TRUE(context.deterministicAlgorithmsWarnOnly());
    }
    EXPECT_FALSE(context.deterministicAlgorithmsWarnOnly());
  }
  EXPECT_FALSE(context.deterministicAlgorithms());
  if (cuda_usable()) {
    TempDir dir;
    const auto r = cli({"run", dir.write("c.toml", kSmallCases), "--device", "cuda"});
    EXPECT_EQ(r.code, 0) << r.out << r.err;
    EXPECT_FALSE(context.deterministicAlgorithms());
  }
  context.setDeterministicAlgorithms(was, was_warn_only);
}

TEST(Cli, SmokeSuiteListsEveryRequiredCombination) {
  const auto r = cli({"list", "--suite", "smoke", "--cases-dir", GRADSCOPE_TEST_CASES_DIR});
  ASSERT_EQ(r.code, 0) << r.err;
  for (const char* bits : {"b2", "b3", "b4", "b8"}) {
    for (const char* group : {"gall", "g128"}) {
      for (bool act : {false, true}) {
        for (const char* fmt : {"v1", "v2"}) {
          for (const char* sym : {"sym", "asym"}) {
            for (const char* dtype : {"fp32", "fp16", "bf16"}) {
              const std::string prefix = std::string("dequant.") + dtype + ".";
              bool found = false;
              std::istringstream lines(r.out);
              for (std::string id; std::getline(lines, id);) {
                found = found ||
                        (id.rfind(prefix, 0) == 0 &&
                         id.find(std::string(".") + bits + group) != std::string::npos &&
                         (id.find(".act") != std::string::npos) == act &&
                         id.find(std::string(".") + fmt + "." + sym + ".") != std::string::npos);
              }
              EXPECT_TRUE(found) << dtype << " " << bits << group << (act ? " act " : " ") << fmt
                                 << sym;
            }
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace gradscope

namespace gradscope {
namespace {

TEST(CliFaults, ListsTheCatalogueAndRejectsUnknownNames) {
  const auto list = testing::run_captured({"faults"});
  ASSERT_EQ(list.code, 0);
  EXPECT_GE(std::count(list.out.begin(), list.out.end(), '\n'), 12);
  EXPECT_NE(list.out.find("3bit-straddle-high-bits-dropped"), std::string::npos);
  const auto bad = testing::run_captured({"run", "--inject", "no-such-fault"});
  EXPECT_EQ(bad.code, 2);
  EXPECT_NE(bad.err.find("--inject no-such-fault: no such fault"), std::string::npos) << bad.err;
}

TEST(CliFaults, InjectionLastsForTheRunOnly) {
  ::gradscope::testing::TempDir dir;
  const auto c = dir.write("c.toml", "kind = \"dequant\"\nin_features = 64\nout_features = 32\n");
  const auto faulty =
      testing::run_captured({"run", c, "--inject", "scales-wrong-column", "--quiet"});
  EXPECT_EQ(faulty.code, 1);
  EXPECT_NE(faulty.out.find("injected fault: scales-wrong-column"), std::string::npos);
  EXPECT_NE(faulty.out.find("/gptq/weight: not bit-exact"), std::string::npos) << faulty.out;
  EXPECT_EQ(testing::run_captured({"run", c, "--quiet"}).code, 0);
}

TEST(CliFaults, FailFastStopsAtTheFirstFailingCase) {
  ::gradscope::testing::TempDir dir;
  const auto c = dir.write("c.toml", kSmallCases);
  const auto json = dir.path("r.json");
  const auto r = testing::run_captured(
      {"run", c, "--inject", "scales-wrong-column", "--fail-fast", "--quiet", "--json", json});
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("--fail-fast: stopped at the first failing case; 3 of 4 cases not run"),
            std::string::npos)
      << r.out;
  std::ifstream in(json);
  EXPECT_EQ(nlohmann::json::parse(in)["cases"].size(), 1u);
}

// `sample`: the same seed draws the same cases, and each written case file replays its case.
TEST(CliSample, DrawsValidCasesAndReplaysThemFromFiles) {
  testing::TempDir dir;
  const auto r =
      testing::run_captured({"sample", "--count", "12", "--seed", "5", "--kinds", "lora_w,dequant",
                             "--cases-out", dir.path("cases"), "--json", dir.path("s.json")});
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("sample summary: 12 cases run"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("0 false alarms"), std::string::npos) << r.out;
  // The same seed draws the same cases; each case file replays its case.
  const auto again = testing::run_captured(
      {"sample", "--count", "12", "--seed", "5", "--kinds", "lora_w,dequant"});
  EXPECT_EQ(again.out.substr(again.out.find("sample summary")),
            r.out.substr(r.out.find("sample summary")));
  const auto replay = testing::run_captured({"run", dir.path("cases/case-00003.toml"), "--quiet"});
  EXPECT_EQ(replay.code, 0) << replay.out;
  const auto bad = testing::run_captured({"sample", "--kinds", "nope"});
  EXPECT_EQ(bad.code, 2);
  EXPECT_NE(bad.err.find("the sampler draws no kind 'nope'"), std::string::npos) << bad.err;
}

// --draw-only writes the draw and runs nothing; a prefix of a draw is the shorter draw.
TEST(CliSample, DrawOnlyWritesThePrefixOfALongerDraw) {
  testing::TempDir dir;
  const auto r = testing::run_captured(
      {"sample", "--count", "4", "--seed", "5", "--draw-only", "--cases-out", dir.path("short")});
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("wrote 4 cases to"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("sample summary"), std::string::npos) << r.out;
  const auto longer = testing::run_captured(
      {"sample", "--count", "9", "--seed", "5", "--draw-only", "--cases-out", dir.path("long")});
  EXPECT_EQ(longer.code, 0) << longer.err;
  EXPECT_EQ(testing::read_file(dir.path("short/case-00003.toml")),
            testing::read_file(dir.path("long/case-00003.toml")));
  // Without --cases-out a failing or invalid case's replay line draws its file first.
  const auto no_files = testing::run_captured({"sample", "--draw-only"});
  EXPECT_EQ(no_files.code, 2) << no_files.out;
}

}  // namespace
}  // namespace gradscope

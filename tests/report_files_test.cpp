// The files a run writes (reports/output_file.h, harness/cli/output_paths.h, the dump writer):
// output targets that are devices, pipes or the same file twice, temporaries that are
// exclusive and removed on an error or a signal, dumps written case by case, reports that hold
// non-finite numbers and read back. Each gets exit 0 or 2 (stated per test), a message naming
// the problem, and no file left behind.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "cli_capture.h"
#include "harness/common/file_system.h"
#include "reports/hdf5_dump.h"
#include "reports/output_file.h"
#include "test_files.h"

namespace gradscope {
namespace {

using testing::TempDir;

using testing::kSmallCase;
using testing::read_file;

testing::CliResult cli(const std::vector<std::string>& args) {
  return testing::run_captured(args);
}

bool is_character_device(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISCHR(st.st_mode);
}

TEST(OutputFiles, DevicesAreWrittenThroughNeverReplaced) {
  TempDir dir;
  const auto c = dir.write("c.toml", kSmallCase);
  const auto r = cli({"run", c, "--json", "/dev/null", "--quiet"});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(is_character_device("/dev/null"));
  // /dev/full fails every write with ENOSPC: the run says so and exits 2.
  if (is_character_device("/dev/full")) {
    const auto full = cli({"run", c, "--json", "/dev/full", "--quiet"});
    EXPECT_EQ(full.code, 2);
    EXPECT_NE(full.err.find("/dev/full: No space left on device"), std::string::npos) << full.err;
    EXPECT_TRUE(is_character_device("/dev/full"));
  }
  // An HDF5 dump needs a regular file.
  const auto dump = cli({"run", c, "--dump", "/dev/null", "--quiet"});
  EXPECT_EQ(dump.code, 2);
  EXPECT_NE(dump.err.find("regular file"), std::string::npos) << dump.err;
  EXPECT_EQ(files::find_files(dir.path(), ""), std::vector<std::string>{c});
}

TEST(OutputFiles, SameTargetTwiceEmptyOrDashIsRefused) {
  TempDir dir;
  const auto c = dir.write("c.toml", kSmallCase);
  const struct {
    std::vector<std::string> args;
    std::string expected;
  } bad[] = {
      {{"run", c, "--json", dir.path("x"), "--dump", dir.path("x")}, "the same file as --json"},
      {{"run", c, "--json", dir.path("./x"), "--html", dir.path("x")}, "the same file as --json"},
      {{"run", c, "--json", c}, "is an input"},
      {{"run", c, "--json", ""}, "--json"},
      {{"run", c, "--inject", ""}, "--inject"},
      {{"run", c, "--json", "-"}, "standard output"},
      {{"run", c, "--junit", dir.path()}, "folder"},
  };
  for (const auto& b : bad) {
    const auto r = cli(b.args);
    EXPECT_EQ(r.code, 2) << b.expected << "\n" << r.out << r.err;
    EXPECT_NE(r.err.find(b.expected), std::string::npos) << r.err;
  }
  EXPECT_EQ(read_file(c), kSmallCase);
  EXPECT_EQ(files::find_files(dir.path(), ""), std::vector<std::string>{c});
}

// A temporary's name is not predictable from the target and the pid, and it is created
// exclusively: a file planted at the old name is neither followed nor overwritten.
TEST(OutputFiles, TemporariesAreExclusiveAndRemovedOnError) {
  TempDir dir;
  const auto target = dir.path("r.json");
  const auto planted = dir.path("r.json.tmp." + std::to_string(::getpid()));
  const auto victim = dir.write("victim", "keep");
  ASSERT_EQ(::symlink(victim.c_str(), planted.c_str()), 0);
  report::write_output_file(target, "{}\n");
  EXPECT_EQ(read_file(target), "{}\n");
  EXPECT_EQ(read_file(victim), "keep");
  {
    report::StagedFile staged(dir.path("never.json"));
    staged.write("partial");
    EXPECT_TRUE(files::is_regular_file(staged.temp_path()));
  }  // not committed: removed
  EXPECT_FALSE(files::exists(dir.path("never.json")));
  for (const auto& f : files::find_files(dir.path(), "")) {
    EXPECT_TRUE(f == target || f == victim || f == planted) << "left behind: " << f;
  }
}

// SIGTERM while a temporary exists removes it and still ends the process by that signal.
TEST(OutputFiles, SignalRemovesTemporaries) {
  TempDir dir;
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    report::StagedFile staged(dir.path("out.h5"));
    staged.write("partial dump");
    std::raise(SIGTERM);
    ::_exit(0);  // not reached
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGTERM) << status;
  EXPECT_TRUE(files::find_files(dir.path(), "").empty());
}

// A dump is written case by case; one abandoned before finish() (an error in a later case)
// leaves no file, and one finished holds every case added.
TEST(Dumps, WrittenCaseByCaseOrNotAtAll) {
  TempDir dir;
  report::CaseResult c;
  c.id = "case";
  c.kind = "lora_w";
  report::Check check;
  check.path = "case/x";
  check.tensors = report::CheckTensors{report::TensorData{"fp32", {2}, {1.0, 2.0}}, std::nullopt,
                                       report::TensorData{"fp64", {2}, {1.0, 2.0}}, std::nullopt};
  c.checks.push_back(check);
  {
    report::DumpWriter abandoned(dir.path("a.h5"), {});
    abandoned.add_case(c);
  }
  EXPECT_TRUE(files::find_files(dir.path(), "").empty());
  report::RunReport run;
  run.cases.push_back(c);
  report::DumpWriter dump(dir.path("b.h5"), {});
  dump.add_case(c);
  dump.finish(run);
  const auto read = report::read_dump(dir.path("b.h5"));
  EXPECT_EQ(read.cases, std::vector<std::string>{"case"});
  EXPECT_EQ(files::find_files(dir.path(), ""), std::vector<std::string>{dir.path("b.h5")});
}

TEST(Reports, NonFiniteErrorsRoundTripThroughAgainst) {
  TempDir dir;
  const auto c = dir.write("c.toml", kSmallCase);
  ASSERT_EQ(cli({"run", c, "--json", dir.path("a.json"), "--quiet"}).code, 0);
  std::string text = read_file(dir.path("a.json"));
  // An accepted report whose first check had a non-finite error, as gradscope writes it, and
  // as a report of an older version (null) did.
  for (const char* replacement : {"\"max_abs\": \"inf\"", "\"max_abs\": null"}) {
    std::string edited = text;
    const auto at = edited.find("\"max_abs\": ");
    ASSERT_NE(at, std::string::npos);
    edited.replace(at, edited.find(',', at) - at, replacement);
    const auto accepted = dir.write("accepted.json", edited);
    const auto r = cli({"run", c, "--against", accepted, "--quiet"});
    EXPECT_EQ(r.code, 0) << replacement << "\n" << r.out << r.err;  // finite now: no regression
  }
  const auto bad = dir.write("bad.json", R"({"tool": "gradscope", "cases": [{"id": "c", "checks": [
      {"path": "c/p", "status": "pass", "max_abs": "huge"}]}]})");
  const auto r = cli({"run", c, "--against", bad, "--quiet"});
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("c/p max_abs is \"huge\""), std::string::npos) << r.err;
  // A field of another type where a string belongs (the fuzzer's first find).
  const auto foreign = dir.write("foreign.json", R"({"tool": 5742910490})");
  const auto f = cli({"run", c, "--against", foreign, "--quiet"});
  EXPECT_EQ(f.code, 2);
  EXPECT_NE(f.err.find("not a gradscope JSON report"), std::string::npos) << f.err;
}

}  // namespace
}  // namespace gradscope

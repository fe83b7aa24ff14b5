// What gradscope refuses (docs/cli.md, "What gradscope refuses"): one test per class of the
// table there, each through the command line as a user reaches it. Every refusal is exit 2 with
// a message naming the file, key, flag or tensor; nothing is left half-written. The classes
// that need another process (a signal, a memory limit, Python) are CTest scripts beside these.
// Below them: dumps that are FIFOs or of an unknown schema, checkpoints that contradict their
// case, sizes this machine cannot hold, and messages short enough to read.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "cli_capture.h"
#include "harness/catalog/case_file.h"
#include "harness/common/file_system.h"
#include "harness/common/input_error.h"
#include "reports/hdf5_dump.h"
#include "test_files.h"

namespace gradscope {
namespace {

using testing::TempDir;

using testing::kSmallCase;
using testing::read_file;

testing::CliResult cli(const std::vector<std::string>& args) {
  return testing::run_captured(args);
}

// Exit 2, with `needle` in what was printed.
void expect_refused(const std::vector<std::string>& args, const std::string& needle) {
  const auto r = cli(args);
  std::string command;
  for (const auto& a : args) command += " " + a;
  EXPECT_EQ(r.code, 2) << command << "\n" << r.out << r.err;
  EXPECT_NE((r.out + r.err).find(needle), std::string::npos)
      << command << "\nexpected: " << needle << "\ngot: " << r.out << r.err;
}

void write(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << text;
}

void replace_in(const std::string& path, const std::string& from, const std::string& to) {
  std::string text = read_file(path);
  const auto at = text.find(from);
  ASSERT_NE(at, std::string::npos) << from << " not in " << path;
  text.replace(at, from.size(), to);
  write(path, text);
}

// A small exported checkpoint: 64 hidden, 2 heads, 1 key/value head, `shards` files of one
// layer each.
std::string export_checkpoint(const TempDir& dir, const std::string& name, int shards = 1) {
  const std::string out = dir.path(name);
  const auto r = cli({"export", "--out", out, "--hidden", "64", "--intermediate", "128", "--heads",
                      "2", "--kv-heads", "1", "--group-size", "32", "--layers",
                      std::to_string(shards), "--shards", std::to_string(shards)});
  EXPECT_EQ(r.code, 0) << r.err;
  return out;
}

std::string nested(int depth, const std::string& leaf) {
  return std::string(depth, '[') + leaf + std::string(depth, ']');
}

TEST(Refusals, ANamespaceRegisteredTwiceIsAnInputError) {
  // gradscope's own operators, again: torch refuses a second TORCH_LIBRARY for a namespace
  // inside dlopen, which used to end the process (134).
  TempDir dir;
  const auto c = dir.write("c.toml", kSmallCase);
  expect_refused({"run", c, "--ops-library", GRADSCOPE_OPS_LIBRARY},
                 "Only a single TORCH_LIBRARY can be used to register the namespace gradscope");
  // One plugin from two paths: the copy registers the namespace the original did.
  const std::string copy = dir.path("copy_of_test_ops.so");
  write(copy, read_file(GRADSCOPE_TEST_OPS_LIBRARY));
  expect_refused({"run", c, "--impl", "plain_torch", "--ops-library", GRADSCOPE_TEST_OPS_LIBRARY,
                  "--ops-library", copy},
                 "--ops-library " + copy + ": cannot load it");
  // The process is still whole: the original alone runs.
  const auto ok = cli(
      {"run", c, "--impl", "plain_torch", "--ops-library", GRADSCOPE_TEST_OPS_LIBRARY, "--quiet"});
  EXPECT_EQ(ok.code, 0) << ok.out << ok.err;
}

TEST(Refusals, DeeplyNestedJsonIsRefusedNotACrash) {
  TempDir dir;
  const auto c = dir.write("c.toml", kSmallCase);
  const auto ckpt = export_checkpoint(dir, "ck");
  const std::string qc = ckpt + "/quantize_config.json";
  const std::string original = read_file(qc);
  write(qc, "{\"bits\": " + nested(100000, "4") + "}");
  expect_refused({"run", "--checkpoint", ckpt}, "nested deeper than 64");
  expect_refused({"dequant", "--checkpoint", ckpt, "--module", "model.layers.0.mlp.down_proj",
                  "--out", dir.path("d.h5")},
                 "nested deeper than 64");
  write(qc, original);
  replace_in(ckpt + "/config.json", "\"hidden_size\": 64",
             "\"hidden_size\": " + nested(100000, "64"));
  expect_refused({"run", "--checkpoint", ckpt}, "config.json");
  // An --against report whose max_abs, or worst, is nested as deep.
  ASSERT_EQ(cli({"run", c, "--json", dir.path("a.json"), "--quiet"}).code, 0);
  std::string report = read_file(dir.path("a.json"));
  const auto at = report.find("\"max_abs\": ");
  ASSERT_NE(at, std::string::npos);
  report.replace(at, report.find(',', at) - at, "\"max_abs\": " + nested(100000, "1"));
  write(dir.path("deep.json"), report);
  expect_refused({"run", c, "--against", dir.path("deep.json"), "--quiet"},
                 "nested deeper than 64");
}

TEST(Refusals, AFifoNamedByTheIndexIsRefusedNotWaitedOn) {
  TempDir dir;
  const auto ckpt = export_checkpoint(dir, "ck", 2);
  const std::string shard = ckpt + "/model-00001-of-00002.safetensors";  // layer 0's
  ASSERT_EQ(::unlink(shard.c_str()), 0);
  ASSERT_EQ(::mkfifo(shard.c_str(), 0600), 0);
  expect_refused({"run", "--checkpoint", ckpt}, "model-00001-of-00002.safetensors");
  expect_refused({"dequant", "--checkpoint", ckpt, "--module", "model.layers.0.mlp.down_proj",
                  "--out", dir.path("d.h5")},
                 "not a regular file");
  // The same for config.json as a FIFO, and as a link to a device that never ends.
  const auto other = export_checkpoint(dir, "ck2");
  const std::string config = other + "/config.json";
  ASSERT_EQ(::unlink(config.c_str()), 0);
  ASSERT_EQ(::mkfifo(config.c_str(), 0600), 0);
  expect_refused({"run", "--checkpoint", other}, "config.json: a FIFO, not a regular file");
  ASSERT_EQ(::unlink(config.c_str()), 0);
  ASSERT_EQ(::symlink("/dev/urandom", config.c_str()), 0);
  expect_refused({"run", "--checkpoint", other}, "not a regular file");
}

TEST(Refusals, FolderLinkLoopsInASuiteAreRefused) {
  TempDir dir;
  ASSERT_EQ(::mkdir(dir.path("s").c_str(), 0755), 0);
  dir.write("s/c.toml", kSmallCase);
  ASSERT_EQ(::symlink("..", dir.path("s/up").c_str()), 0);
  expect_refused({"list", "--cases-dir", dir.path(), "--suite", "s"}, "s/up");
  ASSERT_EQ(::unlink(dir.path("s/up").c_str()), 0);
  ASSERT_EQ(::symlink(".", dir.path("s/self").c_str()), 0);
  expect_refused({"run", "--cases-dir", dir.path(), "--suite", "s"}, "s/self");
}

TEST(Refusals, AZeroReferenceIsNotJudgedNotAFalseAlarm) {
  TempDir dir;
  for (const char* alpha : {"0.0", "1e-300"}) {
    const auto c = dir.write("c.toml", std::string(kSmallCase) + "alpha = " + alpha + "\n");
    const auto r = cli({"run", c, "--quiet"});
    EXPECT_EQ(r.code, 2) << alpha << "\n" << r.out;
    EXPECT_NE(r.out.find("lora_A.grad: cannot be judged: the exact value is all zero"),
              std::string::npos)
        << r.out;
    // The case line counts what it could not judge apart from what failed.
    EXPECT_NE(r.out.find("  0 failed"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("2 not judged"), std::string::npos) << r.out;
  }
  // The same case with the default alpha is judged, and passes.
  const auto c = dir.write("ok.toml", kSmallCase);
  EXPECT_EQ(cli({"run", c, "--quiet"}).code, 0);
}

// fp16 activations of 1e-6: SwiGLU's h (~1e-13) underflows, so a careful implementation returns
// zero gradients for the down projection's adapters, far inside their floors. Not judged, not a
// false alarm; bf16 holds h, and the same case passes.
TEST(Refusals, ZerosACarefulImplementationReturnsAreNotJudged) {
  TempDir dir;
  const std::string mlp =
      "kind = \"mlp\"\nhidden = 64\nintermediate = 128\nbatch = 1\nseq = 8\nx_scale = 1e-6\n";
  const auto c = dir.write("c.toml", mlp + "dtype = \"fp16\"\n");
  const auto r = cli({"run", c, "--quiet"});
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("down_proj/lora_A.grad: cannot be judged: prod is all zero"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("  0 failed"), std::string::npos) << r.out;
  const auto b = dir.write("b.toml", mlp + "dtype = \"bf16\"\n");
  EXPECT_EQ(cli({"run", b, "--quiet"}).code, 0);
}

TEST(Refusals, IntegersThatDoNotFitAreRefusedNotNarrowed) {
  TempDir dir;
  const auto ckpt = export_checkpoint(dir, "ck");
  const std::string qc = ckpt + "/quantize_config.json";
  const std::string original = read_file(qc);
  replace_in(qc, "\"bits\": 4", "\"bits\": 4294967300");
  expect_refused({"run", "--checkpoint", ckpt}, "key 'bits' is 4294967300, outside [2, 8]");
  write(qc, original);
  replace_in(qc, "\"group_size\": 32", "\"group_size\": 4294967424");
  expect_refused({"run", "--checkpoint", ckpt}, "key 'group_size' is 4294967424, outside");
  write(qc, original);
  replace_in(ckpt + "/config.json", "\"num_hidden_layers\": 1",
             "\"num_hidden_layers\": 4294967297");
  expect_refused({"run", "--checkpoint", ckpt}, "key 'num_hidden_layers' is 4294967297, outside");
}

TEST(Refusals, AmbiguousCheckpointsAreRefused) {
  TempDir dir;
  const auto ckpt = export_checkpoint(dir, "ck");
  const std::string qc = ckpt + "/quantize_config.json";
  const std::string original = read_file(qc);
  replace_in(qc, "\"sym\": true", "\"sym\": null");
  expect_refused({"run", "--checkpoint", ckpt}, "key 'sym' is null");
  write(qc, original);
  replace_in(qc, "\"bits\": 4,", "\"bits\": 4, \"meta\": {\"bits\": 8},");
  expect_refused({"run", "--checkpoint", ckpt}, "key 'bits' is 4 but meta.bits is 8");
  write(qc, original);
  replace_in(qc, "\"bits\": 4,", "\"bits\": 4, \"bits\": 8,");
  expect_refused({"run", "--checkpoint", ckpt}, "key \"bits\" appears twice");
  write(qc, original);
  // quantize_config.json and config.json's quantization_config that disagree.
  replace_in(ckpt + "/config.json", "\"model_type\"",
             "\"quantization_config\": {\"bits\": 8, \"group_size\": 32}, \"model_type\"");
  expect_refused({"run", "--checkpoint", ckpt}, "quantize_config.json: key 'bits' is 4 but " +
                                                    ckpt +
                                                    "/config.json: quantization_config gives 8");
  // A weight_map file name holding U+0000.
  const auto sharded = export_checkpoint(dir, "sharded", 2);
  replace_in(sharded + "/model.safetensors.index.json", "model-00002-of-00002.safetensors",
             "model-00002-of-00002.safetensors\\u0000.txt");
  expect_refused({"run", "--checkpoint", sharded}, "U+0000");
}

TEST(Refusals, OutputsNeverTakeANameTheCheckpointReaderReads) {
  TempDir dir;
  const auto ckpt = export_checkpoint(dir, "ck");
  // The config moved into config.json: quantize_config.json is free, but the reader would read
  // a file of that name first next time.
  const std::string qc = read_file(ckpt + "/quantize_config.json");
  ASSERT_EQ(::unlink((ckpt + "/quantize_config.json").c_str()), 0);
  replace_in(ckpt + "/config.json", "\"model_type\"",
             "\"quantization_config\": " + qc + ", \"model_type\"");
  ASSERT_EQ(cli({"list", "--checkpoint", ckpt}).code, 0);
  const std::string module = "model.layers.0.mlp.down_proj";
  for (const char* name :
       {"quantize_config.json", "model.safetensors.index.json", "x.safetensors"}) {
    expect_refused(
        {"dequant", "--checkpoint", ckpt, "--module", module, "--out", ckpt + "/" + name},
        std::string("the checkpoint reader reads ") + name);
    EXPECT_FALSE(files::exists(ckpt + "/" + name)) << name;
  }
  EXPECT_EQ(cli({"run", "--checkpoint", ckpt, "--quiet"}).code, 0);
}

TEST(Refusals, SuiteEntriesThatAreNotFilesAreNamed) {
  TempDir dir;
  ASSERT_EQ(::mkdir(dir.path("s").c_str(), 0755), 0);
  dir.write("s/a.toml", kSmallCase);
  ASSERT_EQ(::mkfifo(dir.path("s/b.toml").c_str(), 0600), 0);
  expect_refused({"run", "--cases-dir", dir.path(), "--suite", "s"}, "s/b.toml");
  ASSERT_EQ(::unlink(dir.path("s/b.toml").c_str()), 0);
  ASSERT_EQ(::symlink("missing.toml", dir.path("s/b.toml").c_str()), 0);
  expect_refused({"list", "--cases-dir", dir.path(), "--suite", "s"}, "s/b.toml");
}

TEST(Refusals, SeedsOutOfRangeAreRefusedNotWrapped) {
  TempDir dir;
  for (const char* seed : {"-1", "18446744073709551616", "18446744073709551615", "1e3", ""}) {
    expect_refused({"sample", "--seed", seed, "--count", "1"}, "--seed");
    expect_refused({"export", "--seed", seed, "--out", dir.path("e")}, "--seed");
  }
  EXPECT_FALSE(files::exists(dir.path("e")));
}

TEST(Refusals, LaxAcceptedReportsAreRefusedByField) {
  TempDir dir;
  const auto c = dir.write("c.toml", kSmallCase);
  const auto against = [&](const std::string& json, const std::string& needle) {
    expect_refused({"run", c, "--quiet", "--against", dir.write("a.json", json)}, needle);
  };
  const std::string head = R"({"tool": "gradscope", "cases": [)";
  against(head + R"({"id": "c"}]})", "case 'c' has no checks array");
  against(head + R"({"id": "c", "checks": [{"path": "c/x", "max_abs": 1, "status": 1}]}]})",
          "c/x status is 1");
  against(head + R"({"id": "c", "checks": [{"path": "c/x", "max_abs": 1, "status": "weird"}]}]})",
          "c/x status is \"weird\"");
  against(head +
              R"({"id": "c", "checks": [{"path": "c/x", "max_abs": 1, "status": "pass",
                  "exact": "yes"}]}]})",
          "c/x exact is \"yes\"");
  against(head + R"({"id": "c", "checks": [{"path": "c/x", "max_abs": 1, "status": "pass"},
                                          {"path": "c/x", "max_abs": 2, "status": "pass"}]}]})",
          "c/x: the check appears twice");
  against(head + R"({"id": "c", "checks": []}, {"id": "c", "checks": []}]})",
          "case 'c' appears twice");
  against(head + R"({"id": "c", "checks": [{"path": "d/x", "max_abs": 1, "status": "pass"}]}]})",
          "does not start with its case id 'c/'");
}

TEST(Refusals, FlagsWithoutThePartnerTheyModifyAreRefused) {
  TempDir dir;
  const auto c = dir.write("c.toml", kSmallCase);
  expect_refused({"run", c, "--against-factor", "2"}, "--against-factor requires --against");
  expect_refused({"run", c, "--dump-failing-only"}, "--dump-failing-only requires --dump");
  expect_refused({"run", c, "--dump-gradients-only"}, "--dump-gradients-only requires --dump");
  expect_refused({"run", c, "--layers", "1"}, "--layers requires --checkpoint");
  expect_refused({"list", c, "--projections", "q_proj"}, "--projections requires --checkpoint");
  for (const char* bad : {"nan", "inf", "-1"}) {
    expect_refused({"sample", "--count", "1", "--max-seconds", bad}, "--max-seconds");
  }
}

TEST(Refusals, MessagesSayWhatIsWrongWithWhichFile) {
  TempDir dir;
  const auto c = dir.write("c.toml", kSmallCase);
  const std::string fifo = dir.path("fifo.json");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  expect_refused({"run", c, "--against", fifo}, fifo + ": not a regular file");
  expect_refused({"run", c, "--against", "/dev/zero"}, "/dev/zero: not a regular file");
  // A folder that exists, given with a trailing slash: it exists, it is not missing.
  expect_refused({"export", "--out", dir.path() + "/"}, "already exists");
  // Integer bounds as integers, float values as they read back.
  expect_refused({"run", dir.write("r.toml", std::string(kSmallCase) + "rank = 5000\n")},
                 "key 'rank' is 5000; expected an integer in [1, 4096]");
  expect_refused({"run", dir.write("a.toml", std::string(kSmallCase) + "alpha = 1000001.0\n")},
                 "key 'alpha' is 1000001; expected a value in [-1000000, 1000000]");
  // A case built as text from a checkpoint names the file and key a value came from, not a
  // line of the generated text.
  try {
    parse_case_text("kind = \"lora_w\"\nrank = 5000\n", "ckpt",
                    {{"rank", "ckpt/config.json (lora_rank)"}});
    ADD_FAILURE() << "rank 5000 accepted";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("ckpt/config.json (lora_rank): key 'rank'"),
              std::string::npos)
        << e.what();
  }
}

TEST(Dumps, FifosUnknownSchemasAndNaNs) {
  TempDir dir;
  const auto fifo = dir.path("pipe.h5");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const auto show = cli({"show", fifo});  // must not block in open()
  EXPECT_EQ(show.code, 2);
  EXPECT_NE(show.err.find("not a regular file"), std::string::npos) << show.err;
  const auto c = dir.write("c.toml", kSmallCase);
  ASSERT_EQ(cli({"run", c, "--dump", dir.path("a.h5"), "--quiet"}).code, 0);
  // Two runs of one case are the same; another seed differs (NaN against NaN: the h5py test).
  ASSERT_EQ(cli({"run", c, "--dump", dir.path("b.h5"), "--quiet"}).code, 0);
  const auto same = cli({"diff", dir.path("a.h5"), dir.path("b.h5")});
  EXPECT_EQ(same.code, 0) << same.out << same.err;
  ASSERT_EQ(cli({"run", c, "--seed", "7", "--dump", dir.path("s7.h5"), "--quiet"}).code, 0);
  const auto other = cli({"diff", dir.path("a.h5"), dir.path("s7.h5")});
  EXPECT_NE(other.code, 0) << other.out << other.err;
  // Every case passed: a --dump-failing-only dump holds no tensors, and is still a dump.
  ASSERT_EQ(cli({"run", c, "--dump", dir.path("empty.h5"), "--dump-failing-only", "--quiet"}).code,
            0);
  const auto empty = cli({"show", dir.path("empty.h5")});
  EXPECT_EQ(empty.code, 0) << empty.err;
  EXPECT_NE(empty.out.find("cases: 0"), std::string::npos) << empty.out;
  for (const char* tolerance : {"-1", "nan"}) {
    const auto r =
        cli({"diff", dir.path("a.h5"), dir.path("a.h5"), "--rtol", tolerance, "--atol", "0"});
    EXPECT_EQ(r.code, 2) << tolerance << r.out << r.err;
    EXPECT_NE(r.err.find("--rtol"), std::string::npos) << r.err;
  }
}

TEST(Checkpoints, CaseFieldsThatContradictTheCheckpointAreRefused) {
  TempDir dir;
  const std::string fixture = std::string(GRADSCOPE_TEST_DATA_DIR) + "/tiny-gptq-v2-3bit-sharded";
  const std::string base =
      "kind = \"mlp\"\nhidden = 64\nintermediate = 128\ncheckpoint = \"" + fixture + "\"\n";
  const std::string matching = "bits = 3\ngroup_size = 32\nsym = false\nformat = \"gptq_v2\"\n";
  const auto ok = cli({"run", dir.write("ok.toml", base + matching), "--quiet"});
  EXPECT_EQ(ok.code, 0) << ok.out << ok.err;
  const struct {
    std::string text, expected;
  } bad[] = {
      {base + "group_size = 32\nsym = false\nformat = \"gptq_v2\"\n", "bits is 3"},
      {base + "bits = 3\nsym = false\nformat = \"gptq_v2\"\n", "group_size is 32"},
      {base + "bits = 3\ngroup_size = 32\nformat = \"gptq_v2\"\n", "sym is false"},
      {base + "bits = 3\ngroup_size = 32\nsym = false\n", "format is gptq_v2"},
      {base + matching + "desc_act = true\n", "desc_act is false"},
      {base + matching + "layer = 2\n", "model.layers.2"},
      {"kind = \"mlp\"\nhidden = 64\nintermediate = 128\ncheckpoint = \"" + dir.path("none") +
           "\"\n",
       "checkpoint folder not found"},
  };
  for (const auto& b : bad) {
    const auto r = cli({"run", dir.write("bad.toml", b.text), "--quiet"});
    EXPECT_EQ(r.code, 2) << b.text << r.out << r.err;
    EXPECT_NE((r.out + r.err).find(b.expected), std::string::npos) << r.out << r.err;
  }
  const auto into = cli({"dequant", "--checkpoint", fixture, "--module",
                         "model.layers.0.mlp.down_proj", "--out", fixture + "/config.json"});
  EXPECT_EQ(into.code, 2);
  EXPECT_NE(into.err.find("would replace a file of the checkpoint"), std::string::npos) << into.err;
}

// Sizes inside the accepted ranges that this machine cannot hold are refused before anything
// is allocated (exit 2 naming the size), not an abort.
TEST(Resources, ExportTooLargeForTheMachineIsRefused) {
  TempDir dir;
  const auto r = cli({"export", "--out", dir.path("huge"), "--layers", "1024", "--hidden", "65536",
                      "--intermediate", "131072", "--heads", "64", "--kv-heads", "8"});
  EXPECT_EQ(r.code, 2) << r.out << r.err;
  EXPECT_NE(r.err.find("GiB; this machine has"), std::string::npos) << r.err;
  EXPECT_TRUE(files::find_files(dir.path(), "").empty());
}

// A case whose fp64 reference alone cannot fit is refused before its inputs are drawn: an
// invalid case (exit 2) naming the size, for every kind with such a bound.
TEST(Resources, CasesTooLargeForTheMachineAreRefusedBeforeAllocating) {
  TempDir dir;
  const std::vector<std::string> cases = {
      dir.write("w.toml", "kind = \"lora_w\"\nin_features = 1048576\nout_features = 1048576\n"),
      dir.write("d.toml", "kind = \"dequant\"\nin_features = 1048576\nout_features = 1048576\n"),
      dir.write("l.toml",
                "kind = \"layer\"\nhidden = 4096\nintermediate = 11008\nheads = 32\n"
                "kv_heads = 8\nbatch = 64\nseq = 65536\n")};
  const auto r = cli({"run", cases[0], cases[1], cases[2], "--json", dir.path("r.json")});
  EXPECT_EQ(r.code, 2) << r.out << r.err;
  for (const char* kind : {"lora_w.", "dequant.", "layer."}) {
    EXPECT_NE(r.out.find(std::string("INVALID  ") + kind), std::string::npos) << kind << r.out;
  }
  const std::string says =
      "GiB of host memory (the reference's fp64 weights and activations); "
      "this machine has";
  size_t count = 0;
  for (auto at = r.out.find(says); at != std::string::npos; at = r.out.find(says, at + 1)) ++count;
  EXPECT_EQ(count, 3u) << r.out;
  EXPECT_TRUE(files::is_regular_file(dir.path("r.json")));
}

TEST(Messages, SayWhatIsWrong) {
  TempDir dir;
  const struct {
    std::vector<std::string> args;
    std::string expected;
  } bad[] = {
      {{"run", dir.write("k.toml", "kind = 3\n")}, "key 'kind' must be a string, got an integer"},
      {{"run", dir.path()}, "is a folder"},
      {{"frobnicate"}, "frobnicate"},
      {{"run", dir.write("c.toml", kSmallCase), "--seed", "-1"}, "--seed"},
  };
  for (const auto& b : bad) {
    const auto r = cli(b.args);
    EXPECT_EQ(r.code, 2) << b.expected << r.out << r.err;
    EXPECT_NE(r.err.find(b.expected), std::string::npos) << r.err;
    EXPECT_LT(r.err.size(), 400u) << r.err;  // one line, not DBL_MAX in 309 digits
  }
}

}  // namespace
}  // namespace gradscope

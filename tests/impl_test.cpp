// The implementation under test chosen by operator namespace (--impl) from a library loaded
// at run time (--ops-library): tests/plugins/test_ops.cpp registers the namespaces used here.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "cli_capture.h"
#include "test_files.h"

namespace gradscope {
namespace {

using testing::run_captured;
using testing::TempDir;

const std::string kLibrary = GRADSCOPE_TEST_OPS_LIBRARY;
const std::string kCases = GRADSCOPE_TEST_CASES_DIR;

testing::CliResult run_impl(const std::string& ns, std::vector<std::string> args) {
  args.insert(args.begin(), "run");
  for (const auto& a : {std::string("--impl"), ns, std::string("--ops-library"), kLibrary})
    args.push_back(a);
  return run_captured(args);
}

bool has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST(Impl, PlainTorchLoraWPassesEverySmokeCase) {
  TempDir dir;
  const auto r = run_impl("plain_torch",
                          {kCases + "/smoke/lora_w.toml", "--quiet", "--json", dir.path("r.json")});
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_TRUE(has(r.out, "24 passed, 0 failed")) << r.out;
  EXPECT_TRUE(has(r.out, "implementation under test: plain_torch (schema 4; " + kLibrary + ")"))
      << r.out;
  std::ifstream in(dir.path("r.json"));
  const auto report = nlohmann::json::parse(in);
  EXPECT_EQ(report["implementation"]["namespace"], "plain_torch");
  EXPECT_EQ(report["implementation"]["schema_version"], 4);
}

TEST(Impl, LeavingTheScalingOutFailsTheOutputAndBothAdapterGradients) {
  const auto r = run_impl("unscaled", {kCases + "/smoke/lora_w.toml", "--filter", "*fp32*r8*"});
  EXPECT_EQ(r.code, 1) << r.out << r.err;
  for (const char* tensor : {"o_proj/output: |prod - ref|", "o_proj/lora_A.grad: |prod - ref|",
                             "o_proj/lora_B.grad: |prod - ref|"}) {
    EXPECT_TRUE(has(r.out, tensor)) << tensor << "\n" << r.out;
  }
  // The replay line names the implementation, so the failing case replays as it ran.
  EXPECT_TRUE(has(r.out, "--impl 'unscaled' --ops-library '" + kLibrary + "'")) << r.out;
}

TEST(Impl, AnOperatorThatDeclinesACaseMakesItUnsupportedNotFailed) {
  TempDir dir;
  const auto r = run_impl("declines_dropout", {kCases + "/smoke/lora_w.toml", "--filter",
                                               "*fp32*r8*", "--json", dir.path("r.json")});
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_TRUE(has(r.out, "UNSUPPORTED")) << r.out;
  EXPECT_TRUE(has(r.out, "declines_dropout: no dropout")) << r.out;
  EXPECT_TRUE(has(r.out, "2 passed, 0 failed, 2 unsupported by declines_dropout")) << r.out;
  std::ifstream in(dir.path("r.json"));
  const auto report = nlohmann::json::parse(in);
  EXPECT_EQ(report["summary"]["unsupported"], 2);
  int unsupported = 0;
  for (const auto& c : report["cases"]) unsupported += c["status"] == "unsupported" ? 1 : 0;
  EXPECT_EQ(unsupported, 2);
}

TEST(Impl, ARunWhoseCasesAreAllDeclinedJudgedNothingAndExits2) {
  // Only dropout cases, all of which the implementation declines: green would mean nothing.
  const auto r = run_impl("declines_dropout", {kCases + "/smoke/lora_w_variants.toml"});
  EXPECT_EQ(r.code, 2) << r.out << r.err;
  EXPECT_TRUE(has(r.err, "no case was judged: 48 unsupported (declines_dropout declined all 48"))
      << r.err;
  // --allow-unsupported: the former behaviour, for those who want it.
  const auto allowed =
      run_impl("declines_dropout", {kCases + "/smoke/lora_w_variants.toml", "--allow-unsupported"});
  EXPECT_EQ(allowed.code, 0) << allowed.out << allowed.err;
}

TEST(Impl, ADifferentSignatureIsRefusedShowingBoth) {
  const auto r = run_impl("old_schema", {kCases + "/smoke/lora_w.toml"});
  EXPECT_EQ(r.code, 2) << r.out << r.err;
  EXPECT_TRUE(has(r.err, "old_schema::lora_w has a different signature")) << r.err;
  EXPECT_TRUE(has(r.err,
                  "registered: (Tensor x, Tensor[] proj, int bits, str zero_format, "
                  "float scaling) -> Tensor"))
      << r.err;
  EXPECT_TRUE(has(r.err,
                  "expected:   (Tensor x, Tensor[] proj, int bits, str zero_format, "
                  "float lora_alpha, bool use_rslora"))
      << r.err;
  EXPECT_FALSE(has(r.out, "PASS")) << "no case may run: " << r.out;
}

TEST(Impl, AMissingOperatorOrNamespaceIsRefusedNamingIt) {
  const auto missing = run_impl("no_lora_w", {kCases + "/smoke/lora_w.toml"});
  EXPECT_EQ(missing.code, 2) << missing.out;
  EXPECT_TRUE(has(missing.err, "has no operator no_lora_w::lora_w (expected no_lora_w::lora_w("))
      << missing.err;
  const auto unknown = run_impl("nobody", {kCases + "/smoke/lora_w.toml"});
  EXPECT_EQ(unknown.code, 2);
  EXPECT_TRUE(has(unknown.err, "has no operator nobody::lora_w")) << unknown.err;
}

// decoder_layer is optional: the cases that call it are unsupported by an implementation of the
// LoRA operators alone (which still runs the rest of a suite), each naming the operator; a run
// of only such cases judged nothing (exit 2).
TEST(Impl, WithoutTheOptionalDecoderLayerItsCasesAreUnsupported) {
  const auto r = run_impl("plain_torch", {kCases + "/smoke/layer_whole.toml"});
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_TRUE(has(r.out, "0 passed, 0 failed, 3 unsupported by plain_torch")) << r.out;
  EXPECT_TRUE(has(r.out,
                  "has no operator plain_torch::decoder_layer (expected "
                  "plain_torch::decoder_layer(Tensor x, Dict(str, Tensor) norms"))
      << r.out;
  EXPECT_TRUE(has(r.err, "no case was judged: 3 unsupported")) << r.err;
  const auto mixed = run_impl("plain_torch", {kCases + "/smoke/layer_whole.toml",
                                              kCases + "/smoke/lora_w.toml", "--quiet"});
  EXPECT_EQ(mixed.code, 0) << mixed.out << mixed.err;
  EXPECT_TRUE(has(mixed.out, "3 unsupported by plain_torch")) << mixed.out;
  // A namespace with none of the contract's operators is refused, optional or not.
  const auto nobody = run_impl("nobody", {kCases + "/smoke/layer_whole.toml"});
  EXPECT_EQ(nobody.code, 2) << nobody.out;
  EXPECT_TRUE(has(nobody.err, "has no operator nobody::decoder_layer")) << nobody.err;
  EXPECT_FALSE(has(nobody.out, "unsupported")) << nobody.out;
}

TEST(Impl, KindsOutsideTheContractAreRefused) {
  const auto r = run_impl("plain_torch", {kCases + "/fsdp/fsdp.toml"});
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_TRUE(has(r.err, "kind 'fsdp' runs gradscope's own kernels only")) << r.err;
}

TEST(Impl, ABadLibraryIsRefusedNamingTheFile) {
  TempDir dir;
  const auto absent =
      run_captured({"run", kCases + "/smoke/lora_w.toml", "--ops-library", dir.path("absent.so")});
  EXPECT_EQ(absent.code, 2);
  EXPECT_TRUE(has(absent.err, "--ops-library " + dir.path("absent.so") + ": not a file"))
      << absent.err;
  const auto text = dir.write("not-a-library.so", "hello");
  const auto bad = run_captured({"run", kCases + "/smoke/lora_w.toml", "--ops-library", text});
  EXPECT_EQ(bad.code, 2);
  EXPECT_TRUE(has(bad.err, "--ops-library " + text + ": cannot load it:")) << bad.err;
}

TEST(Impl, DequantThroughAnotherImplementation) {
  const auto r = run_impl("plain_torch", {kCases + "/smoke/dequant_storage.toml"});
  // Words viewed as floats are gradscope's own storage: another implementation gets int32.
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_TRUE(has(r.out, "unsupported by plain_torch")) << r.out;
  EXPECT_TRUE(has(r.out, "the contract hands packed words over as int32")) << r.out;
  EXPECT_FALSE(has(r.out, "unpacked_codes")) << r.out;
}

TEST(Impl, TheDefaultRunNamesNoImplementation) {
  const auto r = run_captured({"run", kCases + "/smoke/lora_w.toml", "--filter", "*fp32*r8*"});
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_FALSE(has(r.out, "implementation under test")) << r.out;
  EXPECT_FALSE(has(r.out, "--impl")) << r.out;
}

}  // namespace
}  // namespace gradscope

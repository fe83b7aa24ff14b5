// Model-family declarations (docs/model-families.md): the shipped ones read, a declaration of
// what gradscope does not model refused naming its file and key, and a layer case checked
// against its family.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "harness/catalog/case_file.h"
#include "harness/common/input_error.h"
#include "harness/spec/model_family.h"
#include "test_files.h"

namespace gradscope {
namespace {

using testing::TempDir;

std::string shipped(const std::string& name) {
  std::ifstream in(std::string(GRADSCOPE_TEST_FAMILIES_DIR) + "/" + name + ".toml");
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

std::string replaced(std::string text, const std::string& from, const std::string& to) {
  const auto at = text.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  return at == std::string::npos ? text : text.replace(at, from.size(), to);
}

std::string read_error(const std::string& path) {
  try {
    read_model_family(path);
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

// Points the engine at a families folder for one test.
class FamiliesDir {
 public:
  explicit FamiliesDir(const std::string& dir) { setenv("GRADSCOPE_FAMILIES_DIR", dir.c_str(), 1); }
  ~FamiliesDir() { unsetenv("GRADSCOPE_FAMILIES_DIR"); }
};

TEST(ModelFamily, TheShippedDeclarationsRead) {
  const FamiliesDir env(GRADSCOPE_TEST_FAMILIES_DIR);
  const auto& llama = model_family("llama");
  EXPECT_EQ(llama.model_types, std::vector<std::string>{"llama"});
  EXPECT_EQ(llama.norms.kind, "rms");
  EXPECT_EQ(llama.norms.eps, "rms_norm_eps");
  EXPECT_FALSE(llama.attention.scaling.configured());
  EXPECT_FALSE(llama.residual.multiplier.configured());
  EXPECT_EQ(model_family("mistral").attention.sliding_window.config, "sliding_window");
  const auto& granite = model_family("granite");
  EXPECT_EQ(granite.attention.scaling.config, "attention_multiplier");
  EXPECT_EQ(granite.residual.multiplier.config, "residual_multiplier");
  try {
    model_family("qwen3");
    ADD_FAILURE() << "an undeclared family was found";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("no model family 'qwen3'"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("granite, llama, mistral"), std::string::npos) << e.what();
  }
}

TEST(ModelFamily, WhatIsNotModelledIsRefusedNamingFileAndKey) {
  TempDir dir;
  const auto llama = shipped("llama");
  const struct {
    std::string from, to, expected;
  } bad[] = {
      {"types = [\"default\", \"llama3\"]", "types = [\"yarn\"]",
       "rope.types holds 'yarn'; gradscope models the rope_types default, llama3"},
      {"kind = \"rms\"", "kind = \"layer\"", "norms.kind is 'layer'; gradscope models rms"},
      {"activation = \"silu\"", "activation = \"gelu_tanh\"", "mlp.activation is 'gelu_tanh'"},
      {"mlp = [\"gate_proj\", \"up_proj\", \"down_proj\"]",
       "mlp = [\"gate_up_proj\", \"down_proj\"]",
       "projections.mlp is [gate_up_proj, down_proj]; gradscope models separate"},
      {"scaling = \"default\"", "scaling = \"attention_multiplier\"",
       "attention.scaling must be 'default' or 'config.<attribute>'"},
      {"scaling = \"default\"", "scaling = 0.5", "attention.scaling must be a string"},
      {"eps = \"rms_norm_eps\"", "eps = \"rms norm\"", "norms.eps must name a config attribute"},
      {"mask = \"causal\"\n", "mask = \"causal\"\nwindow = 4\n", "unknown key attention.window"},
      {"[residual]\nmultiplier = \"default\"\n", "", "residual is missing"},
      {"model_types = [\"llama\"]", "model_types = []", "model_types must be a non-empty array"},
  };
  for (const auto& b : bad) {
    const auto path = dir.write("family.toml", replaced(llama, b.from, b.to));
    const auto err = read_error(path);
    EXPECT_NE(err.find(path), std::string::npos) << err;
    EXPECT_NE(err.find(b.expected), std::string::npos) << b.expected << "\n" << err;
  }
  EXPECT_NE(read_error(dir.write("nul.toml", std::string("description = \"a\0b\"\n", 18)))
                .find("control character U+0000"),
            std::string::npos);
  EXPECT_NE(read_error(dir.path("absent.toml")).find("model-family declaration not found"),
            std::string::npos);
}

TEST(ModelFamily, OneFamilyPerModelType) {
  TempDir dir;
  dir.write("llama.toml", shipped("llama"));
  dir.write("other.toml", shipped("llama"));
  const FamiliesDir env(dir.path());
  try {
    model_families();
    ADD_FAILURE() << "two declarations of model_type llama were accepted";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("model_type 'llama' is declared by"), std::string::npos)
        << e.what();
  }
}

std::string case_error(const std::string& text) {
  TempDir dir;
  try {
    parse_case_text(text, dir.path("case.toml"));
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

TEST(ModelFamily, ALayerCaseGivesValuesOnlyToThePartsItsFamilyConfigures) {
  const FamiliesDir env(GRADSCOPE_TEST_FAMILIES_DIR);
  const std::string layer = "kind = \"layer\"\nbits = 4\ngroup_size = 32\n";
  EXPECT_EQ(case_error(layer + "family = \"granite\"\nattention_scaling = 0.0078125\n"
                               "residual_multiplier = 0.22\n"),
            "");
  EXPECT_NE(case_error(layer + "residual_multiplier = 0.22\n")
                .find("residual_multiplier must be 1 for family llama"),
            std::string::npos);
  EXPECT_NE(case_error(layer + "family = \"mistral\"\nattention_scaling = 0.1\n")
                .find("attention_scaling must be 0 for family mistral"),
            std::string::npos);
  EXPECT_NE(case_error(layer + "family = \"gemma\"\n").find("no model family 'gemma'"),
            std::string::npos);
  EXPECT_EQ(case_error(layer + "rope_type = \"llama3\"\nrope_factor = 32.0\n"), "");
  EXPECT_NE(case_error(layer + "family = \"granite\"\nrope_type = \"llama3\"\n")
                .find("rope_type 'llama3' is not a rope_type of family granite"),
            std::string::npos);
  EXPECT_NE(case_error(layer + "rope_factor = 32.0\n")
                .find("rope_factor is read only with rope_type = \"llama3\""),
            std::string::npos);
  EXPECT_NE(case_error(layer + "rope_type = \"llama3\"\nrope_high_freq_factor = 1.0\n")
                .find("rope_high_freq_factor must exceed rope_low_freq_factor"),
            std::string::npos);
}

}  // namespace
}  // namespace gradscope

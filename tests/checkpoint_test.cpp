#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <sys/stat.h>

#include <fstream>
#include <functional>
#include <iterator>
#include <limits>

#include "cli_capture.h"
#include "error_text.h"
#include "harness/checkpoint/checkpoint_reader.h"
#include "harness/checkpoint/checkpoint_writer.h"
#include "harness/checkpoint/safetensors_file.h"
#include "harness/common/file_system.h"
#include "harness/common/input_error.h"
#include "harness/generate/gptq_layer_gen.h"
#include "test_files.h"

namespace gradscope {
namespace {

using testing::TempDir;

const std::string kData = GRADSCOPE_TEST_DATA_DIR;

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

struct Generated {
  std::string dir;
  uint64_t seed;
  int64_t layers;
  QuantizeOptions q;
  ZeroPointFormat format;
};

// What export wrote must come back word for word: regenerate each module from its seed.
void expect_matches_regeneration(const Generated& g) {
  const GptqCheckpoint ckpt(g.dir);
  EXPECT_EQ(ckpt.config().bits, g.q.bits);
  EXPECT_EQ(ckpt.config().group_size, g.q.group_size);
  EXPECT_EQ(ckpt.config().desc_act, g.q.desc_act);
  EXPECT_EQ(ckpt.config().sym, g.q.sym);
  EXPECT_EQ(ckpt.config().format, g.format);
  ASSERT_EQ(ckpt.modules().size(), static_cast<size_t>(7 * g.layers));
  for (int64_t layer = 0; layer < g.layers; ++layer) {
    for (const char* p :
         {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}) {
      const auto [in, out] = projection_shape(ckpt.dims(), p);
      const std::string name = module_name(layer, p);
      const auto want = pack_gptq(quantize_seeded_layer(g.seed, name + ".", in, out, g.q), g.q.bits,
                                  g.format, at::kHalf);
      const auto got = ckpt.load(name).weight;
      EXPECT_TRUE(at::equal(got.qweight, want.qweight)) << g.dir << " " << name;
      EXPECT_TRUE(at::equal(got.qzeros, want.qzeros)) << g.dir << " " << name;
      EXPECT_TRUE(at::equal(got.scales, want.scales)) << g.dir << " " << name;
      EXPECT_TRUE(at::equal(got.g_idx, want.g_idx)) << g.dir << " " << name;
    }
  }
}

QuantizeOptions options(int bits, int group, bool desc_act, bool sym, ZeroPointFormat f) {
  return quantize_options(bits, group, sym, desc_act, /*static_groups=*/false, f);
}

TEST(Checkpoint, CommittedFixturesMatchTheirRegeneration) {
  expect_matches_regeneration({kData + "/tiny-gptq-v1-act", 5, 1,
                               options(4, 32, true, true, ZeroPointFormat::kGptqV1),
                               ZeroPointFormat::kGptqV1});
  expect_matches_regeneration({kData + "/tiny-gptq-v2-3bit-sharded", 6, 2,
                               options(3, 32, false, false, ZeroPointFormat::kGptqV2),
                               ZeroPointFormat::kGptqV2});
  const GptqCheckpoint sharded(kData + "/tiny-gptq-v2-3bit-sharded");
  EXPECT_EQ(sharded.dims().layers, 2);
  EXPECT_EQ(sharded.dims().kv_heads, 1);
}

TEST(Checkpoint, ExportRoundTripsBitExact) {
  TempDir dir;
  ExportOptions o;
  o.dir = dir.path("ck");
  o.layers = 2;
  o.hidden = 64;
  o.intermediate = 96;
  o.heads = 2;
  o.kv_heads = 2;
  o.bits = 2;
  o.group_size = -1;
  o.desc_act = true;
  o.shards = 2;
  o.seed = 11;
  export_checkpoint(o);
  expect_matches_regeneration({o.dir, 11, 2, options(2, -1, true, true, ZeroPointFormat::kGptqV1),
                               ZeroPointFormat::kGptqV1});
  // A second export into the same folder is refused; nothing temporary is left beside it.
  EXPECT_NE(testing::input_error_of([&] { export_checkpoint(o); }).find("already exists"),
            std::string::npos);
  EXPECT_EQ(files::subdirectories(dir.path()), std::vector<std::string>{"ck"});
}

std::string file_image(const std::string& header, const std::string& data) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((header.size() >> (8 * i)) & 0xFF);
  return out + header + data;
}

std::string header_error(const std::string& image) {
  return testing::input_error_of([&] {
    safetensors::parse_header(reinterpret_cast<const uint8_t*>(image.data()), image.size(),
                              "f.safetensors");
  });
}

TEST(Safetensors, HeaderProblemsNameTheFileAndTensor) {
  const std::string data(16, '\0');
  const struct {
    std::string image, expected;
  } cases[] = {
      {"abc", "f.safetensors: not a safetensors file (3 bytes)"},
      {std::string("\xff\xff\xff\xff\0\0\0\0", 8) + "{}", "header length 4294967295 exceeds"},
      {file_image("{\"a\": ", data), "header is not valid JSON"},
      {file_image("[1, 2]", data), "header is not a JSON object"},
      {file_image(R"({"w": {"dtype": "Q4", "shape": [2], "data_offsets": [0, 8]}})", data),
       "tensor 'w' has unknown dtype 'Q4'"},
      {file_image(R"({"w": {"dtype": "F32", "data_offsets": [0, 8]}})", data),
       "tensor 'w' has no shape array"},
      {file_image(R"({"w": {"dtype": "F32", "shape": [-2], "data_offsets": [0, 8]}})", data),
       "tensor 'w' has a shape entry that is not a size"},
      {file_image(R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": [8, 24]}})", data),
       "tensor 'w' data_offsets [8, 24) lie outside the data buffer of 16 bytes"},
      {file_image(R"({"w": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}})", data),
       "tensor 'w' holds 8 bytes but its shape and F32 need 12"},
      {file_image(
           R"({"w": {"dtype": "F32", "shape": [4611686018427387904, 8], "data_offsets": [0, 8]}})",
           data),
       "tensor 'w' has a shape whose size overflows"},
      {file_image(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                      "b": {"dtype": "I32", "shape": [2], "data_offsets": [4, 12]}})",
                  data),
       "tensors 'a' and 'b' overlap in the data buffer"},
      {file_image(R"({"__metadata__": {"format": 1}})", data),
       "__metadata__.format is not a string"},
      // A tensor named twice: readers disagree on which entry wins, so neither does.
      {file_image(R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                      "w": {"dtype": "F32", "shape": [2], "data_offsets": [8, 16]}})",
                  data),
       "key \"w\" appears twice in one object"},
  };
  for (const auto& c : cases) {
    EXPECT_NE(header_error(c.image).find(c.expected), std::string::npos)
        << "expected: " << c.expected << "\ngot: " << header_error(c.image);
  }
}

TEST(Safetensors, WriterOutputReadsBack) {
  TempDir dir;
  safetensors::write_file(dir.path("t.safetensors"),
                          {{"z", "I32", {2}, std::string("\1\0\0\0\2\0\0\0", 8)},
                           {"a", "F16", {1, 3}, std::string("\0\x3c\0\x40\0\x42", 6)}},
                          {{"format", "pt"}});
  const safetensors::File f(dir.path("t.safetensors"));
  EXPECT_EQ(f.header().data_offset % 8, 0u);
  EXPECT_EQ(f.header().metadata.at("format"), "pt");
  ASSERT_NE(f.find("a"), nullptr);
  EXPECT_EQ(f.find("a")->shape, (std::vector<int64_t>{1, 3}));
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(f.data(*f.find("z"))), 8),
            std::string("\1\0\0\0\2\0\0\0", 8));
  EXPECT_EQ(f.find("missing"), nullptr);
}

// A copy of the v1 fixture whose module `module` is rewritten by `edit`.
std::string corrupted_copy(const TempDir& dir, const std::string& name,
                           const std::function<void(std::map<std::string, at::Tensor>&)>& edit) {
  const std::string src = kData + "/tiny-gptq-v1-act";
  const std::string out = dir.path(name);
  EXPECT_EQ(::mkdir(out.c_str(), 0755), 0);
  for (const char* f : {"config.json", "quantize_config.json"}) {
    std::ofstream(out + "/" + f, std::ios::binary) << slurp(src + "/" + f);
  }
  const GptqCheckpoint ckpt(src);
  const std::string module = "model.layers.0.self_attn.o_proj";
  const auto w = ckpt.load(module).weight;
  std::map<std::string, at::Tensor> tensors = {{module + ".qweight", w.qweight},
                                               {module + ".qzeros", w.qzeros},
                                               {module + ".scales", w.scales},
                                               {module + ".g_idx", w.g_idx}};
  edit(tensors);
  std::vector<safetensors::OutputTensor> list;
  for (const auto& [n, t] : tensors) {
    const auto c = t.contiguous();
    const char* dtype = c.scalar_type() == at::kInt    ? "I32"
                        : c.scalar_type() == at::kHalf ? "F16"
                                                       : "F32";
    list.push_back({n, dtype, c.sizes().vec(),
                    std::string(static_cast<const char*>(c.data_ptr()), c.nbytes())});
  }
  safetensors::write_file(out + "/model.safetensors", list, {});
  return out;
}

std::string load_error(const std::string& dir) {
  return testing::input_error_of(
      [&] { GptqCheckpoint(dir).load("model.layers.0.self_attn.o_proj"); });
}

TEST(Checkpoint, BadTensorsAreRefusedNamingFileAndTensor) {
  TempDir dir;
  const std::string m = "model.layers.0.self_attn.o_proj";
  EXPECT_NE(load_error(corrupted_copy(dir, "a", [&](auto& t) { t.erase(m + ".g_idx"); }))
                .find("no tensor " + m + ".g_idx"),
            std::string::npos);
  EXPECT_NE(load_error(corrupted_copy(
                           dir, "b",
                           [&](auto& t) { t[m + ".qweight"] = t[m + ".qweight"].to(at::kFloat); }))
                .find(m + ".qweight is F32; expected I32"),
            std::string::npos);
  EXPECT_NE(load_error(corrupted_copy(dir, "c",
                                      [&](auto& t) {
                                        t[m + ".scales"] =
                                            t[m + ".scales"].narrow(0, 0, 1).contiguous();
                                      }))
                .find(m + ".scales has shape [1, 64]; expected [2, 64] (2 groups of 32)"),
            std::string::npos);
  EXPECT_NE(load_error(corrupted_copy(dir, "d",
                                      [&](auto& t) {
                                        t[m + ".g_idx"] = t[m + ".g_idx"].clone();
                                        t[m + ".g_idx"][5] = 7;
                                      }))
                .find(m + ".g_idx[5] is 7; expected a group in [0, 2)"),
            std::string::npos);
  EXPECT_NE(load_error(corrupted_copy(dir, "e",
                                      [&](auto& t) {
                                        t[m + ".scales"] = t[m + ".scales"].clone();
                                        t[m + ".scales"][1][3] =
                                            std::numeric_limits<float>::quiet_NaN();
                                      }))
                .find(m + ".scales[1, 3] is nan (1 non-finite scales)"),
            std::string::npos);
  // A v1 field of maxq (15 at 4 bits) is the spilled zero of 0.
  EXPECT_NE(load_error(corrupted_copy(dir, "f",
                                      [&](auto& t) {
                                        t[m + ".qzeros"] = t[m + ".qzeros"].clone();
                                        t[m + ".qzeros"][0][1] = static_cast<int32_t>(0x777777F7);
                                      }))
                .find(m + ".qzeros: group 0, column 9 stores 15 in gptq (v1) format"),
            std::string::npos);
  const auto bad_config = corrupted_copy(dir, "g", [](auto&) {});
  std::ofstream(bad_config + "/quantize_config.json") << R"({"bits": 5, "group_size": 32})";
  EXPECT_NE(
      load_error(bad_config).find("quantize_config.json: key 'bits' is 5; expected 2, 3, 4 or 8"),
      std::string::npos);
  std::ofstream(bad_config + "/quantize_config.json") << R"({"quant_method": "awq"})";
  EXPECT_NE(load_error(bad_config).find("key 'quant_method' is 'awq', not 'gptq'"),
            std::string::npos);
  std::ofstream(bad_config + "/quantize_config.json") << R"({"meta": {"static_groups": "yes"}})";
  EXPECT_NE(load_error(bad_config).find("key 'static_groups' must be a boolean"),
            std::string::npos);
  std::ofstream(bad_config + "/model.safetensors.index.json")
      << R"({"weight_map": {"x": "../elsewhere.safetensors"}})";
  std::ofstream(bad_config + "/quantize_config.json") << R"({"bits": 4})";
  EXPECT_NE(load_error(bad_config).find("not a file in the checkpoint folder"), std::string::npos);
  EXPECT_NE(load_error(dir.path("absent")).find("checkpoint folder not found"), std::string::npos);
}

TEST(CheckpointCli, RunDequantAndExport) {
  TempDir dir;
  const std::string fixture = kData + "/tiny-gptq-v2-3bit-sharded";
  const auto run =
      testing::run_captured({"run", "--checkpoint", fixture, "--layers", "0,1", "--projections",
                             "k_proj,down_proj", "--dtype", "bf16", "--quiet"});
  EXPECT_EQ(run.code, 0) << run.out << run.err;
  EXPECT_NE(run.out.find("4 passed, 0 failed"), std::string::npos) << run.out;
  const auto dq =
      testing::run_captured({"dequant", "--checkpoint", fixture, "--module",
                             "model.layers.1.mlp.down_proj", "--out", dir.path("w.h5")});
  EXPECT_EQ(dq.code, 0) << dq.err;
  EXPECT_NE(dq.out.find("W [64, 128] fp32, 3-bit, group_size 32 (4 groups), gptq_v2"),
            std::string::npos)
      << dq.out;
  EXPECT_TRUE(files::is_regular_file(dir.path("w.h5")));
  const struct {
    std::vector<std::string> args;
    std::string expected;
  } bad[] = {
      {{"run", "--checkpoint", fixture, "--layers", "2"},
       "layer 2 is outside the model's 2 layers"},
      {{"run", "--checkpoint", fixture, "--projections", "lm_head"},
       "unknown projection 'lm_head'"},
      {{"run", "--checkpoint", fixture, "--suite", "smoke"}, "give no case files or --suite"},
      {{"dequant", "--checkpoint", fixture, "--module", "model.layers.0.mlp.nope", "--out",
        dir.path("x.h5")},
       "no module model.layers.0.mlp.nope"},
      {{"export", "--out", fixture}, "already exists"},
      {{"export", "--out", dir.path("e"), "--bits", "3", "--hidden", "48", "--heads", "1",
        "--kv-heads", "1"},
       "cannot be packed at 3 bits"},
  };
  for (const auto& c : bad) {
    const auto r = testing::run_captured(c.args);
    EXPECT_EQ(r.code, 2) << c.expected << "\n" << r.out << r.err;
    EXPECT_NE(r.err.find(c.expected), std::string::npos) << r.err;
  }
  EXPECT_FALSE(files::is_regular_file(dir.path("x.h5")));
  EXPECT_FALSE(files::is_directory(dir.path("e")));
}

// A layer stack on a checkpoint starts at the case's `layer`: layers = 2 from layer 0 of a
// two-layer checkpoint reads layers 0 and 1 and runs; from layer 1 it would need layer 2.
TEST(CheckpointCli, LayerStackStartsAtTheCaseLayer) {
  TempDir dir;
  const std::string fixture = kData + "/tiny-gptq-v2-3bit-sharded";
  const auto stack = [&](int first) {
    return dir.write("stack" + std::to_string(first) + ".toml",
                     "kind = \"layer\"\nhidden = 64\nintermediate = 128\nheads = 2\n"
                     "kv_heads = 1\nlayers = 2\nbits = 3\ngroup_size = 32\nsym = false\n"
                     "format = \"gptq_v2\"\ncheckpoint = \"" +
                         fixture + "\"\nlayer = " + std::to_string(first) + "\n");
  };
  const auto from0 = testing::run_captured({"run", stack(0), "--quiet"});
  EXPECT_EQ(from0.code, 0) << from0.out << from0.err;
  EXPECT_NE(from0.out.find("1 passed, 0 failed"), std::string::npos) << from0.out;
  const auto from1 = testing::run_captured({"run", stack(1), "--quiet"});
  EXPECT_EQ(from1.code, 2) << from1.out << from1.err;
  EXPECT_NE((from1.out + from1.err).find("model.layers.2"), std::string::npos)
      << from1.out << from1.err;
}

}  // namespace
}  // namespace gradscope

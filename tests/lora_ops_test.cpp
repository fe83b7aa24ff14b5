#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include <cstdlib>
#include <string>

#include "error_text.h"
#include "gradscope/dequant.h"
#include "gradscope/lora_ops.h"
#include "gradscope/swiglu.h"
#include "harness/baseline/aten_baseline.h"

namespace gradscope {
namespace {

GptqWeight layer(int64_t in, int64_t out, int bits = 4) {
  QuantizeOptions o;
  o.bits = bits;
  o.group_size = 32;
  const auto q = quantize_gptq(at::randn({in, out}) * 0.02, at::Tensor(), o);
  return pack_gptq(q, bits, ZeroPointFormat::kGptqV1, at::kHalf);
}

LoraProjection projection(int64_t in, int64_t out, int64_t r = 4) {
  LoraProjection p;
  p.base = layer(in, out);
  p.bias = at::randn({out}) * 0.1;
  p.lora_A = (at::randn({r, in}) * 0.1).requires_grad_(true);
  p.lora_B = (at::randn({out, r}) * 0.1).requires_grad_(true);
  p.scaling = 2.0;
  return p;
}

// An empty batch is valid input: an empty output, an empty dX and zero adapter gradients.
TEST(LoraOps, EmptyBatchGivesEmptyOutputsAndZeroAdapterGradients) {
  for (const auto dtype : {at::kFloat, at::kBFloat16}) {
    auto p = projection(64, 32);
    const auto x = at::randn({0, 64}).to(dtype).requires_grad_(true);
    const auto y = lora_w(x, p, LoraDropout{0.1, at::ones({0, 64}, at::kBool)});
    EXPECT_EQ(y.sizes(), (std::vector<int64_t>{0, 32})) << c10::toString(dtype);
    y.backward(at::zeros_like(y));
    EXPECT_EQ(x.grad().sizes(), x.sizes()) << c10::toString(dtype);
    EXPECT_EQ(p.lora_A.grad().abs().sum().item<double>(), 0.0) << c10::toString(dtype);
    EXPECT_EQ(p.lora_B.grad().abs().sum().item<double>(), 0.0) << c10::toString(dtype);
  }
}

TEST(LoraOps, ValidationNamesTheTensorAndTheExpectation) {
  const auto p = projection(64, 32);
  const auto x = at::randn({2, 8, 64});
  EXPECT_NE(testing::torch_error_of([&] {
              lora_w(at::randn({8, 48}), p);
            }).find("x has 48 features but the base weight has in_features 64"),
            std::string::npos);
  auto bad = p;
  bad.lora_A = at::randn({4, 32});
  EXPECT_NE(testing::torch_error_of([&] { lora_w(x, bad); }).find("lora_A must be [r, 64]"),
            std::string::npos);
  bad = p;
  bad.lora_B = at::randn({32, 5});
  EXPECT_NE(testing::torch_error_of([&] { lora_w(x, bad); }).find("lora_B must be [32, 4]"),
            std::string::npos);
  EXPECT_NE(testing::torch_error_of([&] {
              lora_w(x, p, LoraDropout{1.0, at::ones({2, 8, 64}, at::kBool)});
            }).find("dropout p must lie in [0, 1)"),
            std::string::npos);
  EXPECT_NE(testing::torch_error_of([&] {
              lora_w(x, p, LoraDropout{0.1, at::ones({7}, at::kBool)});
            }).find("dropout mask has 7 elements"),
            std::string::npos);
  EXPECT_NE(
      testing::torch_error_of([&] { lora_w(x.to(at::kDouble), p); }).find("x must be float32"),
      std::string::npos);
  EXPECT_NE(testing::torch_error_of([&] {
              lora_mlp(x, projection(64, 32), projection(64, 32), projection(16, 64));
            }).find("down has in_features 16"),
            std::string::npos);
}

TEST(LoraOps, FrozenTensorsAndInputsAreNeverModified) {
  const auto gate = projection(64, 96), up = projection(64, 96), down = projection(96, 64);
  std::vector<at::Tensor> frozen;
  for (const auto* p : {&gate, &up, &down}) {
    for (const auto& t :
         {p->base.qweight, p->base.qzeros, p->base.scales, p->base.g_idx, p->bias}) {
      frozen.push_back(t);
    }
  }
  std::vector<at::Tensor> before;
  for (const auto& t : frozen) before.push_back(t.clone());
  const auto x = at::randn({2, 8, 64}).requires_grad_(true);
  const auto x_before = x.detach().clone();
  const LoraDropout d{0.2, at::rand({2, 8, 64}).gt(0.2)};
  const auto y = lora_mlp(x, gate, up, down, d, LoraDropout{0.2, at::rand({2, 8, 96}).gt(0.2)});
  y.sum().backward();
  for (size_t i = 0; i < frozen.size(); ++i) EXPECT_TRUE(frozen[i].equal(before[i])) << i;
  EXPECT_TRUE(x.detach().equal(x_before));
  EXPECT_TRUE(x.grad().defined());
  EXPECT_FALSE(gate.base.qweight.requires_grad());
}

TEST(LoraOps, TwoAndThreeDimensionalInputsAgree) {
  const auto p = projection(64, 32);
  const auto x = at::randn({2, 8, 64});
  const auto y3 = lora_w(x, p);
  const auto y2 = lora_w(x.reshape({16, 64}), p);
  EXPECT_EQ(y3.sizes(), (at::IntArrayRef{2, 8, 32}));
  EXPECT_TRUE(y3.reshape({16, 32}).equal(y2));
}

TEST(LoraOps, QkvOutputsThatAreNotUsedGiveZeroAdapterGradients) {
  const auto q = projection(64, 64), k = projection(64, 16), v = projection(64, 16);
  const auto x = at::randn({16, 64}).requires_grad_(true);
  const auto out = lora_qkv(x, q, k, v);
  ASSERT_EQ(out.size(), 3u);
  EXPECT_EQ(out[1].sizes(), (at::IntArrayRef{16, 16}));
  const auto grads = torch::autograd::grad({out[0].sum()}, {x, q.lora_A, k.lora_A, v.lora_B}, {},
                                           false, false, /*allow_unused=*/true);
  EXPECT_GT(grads[0].abs().sum().item<double>(), 0);
  EXPECT_GT(grads[1].abs().sum().item<double>(), 0);
  EXPECT_EQ(grads[2].abs().sum().item<double>(), 0);
  EXPECT_EQ(grads[3].abs().sum().item<double>(), 0);
}

TEST(LoraOps, FusedMatchesTheBaselineInFp32) {
  const auto p = projection(64, 32);
  const auto x = at::randn({3, 5, 64});
  EXPECT_TRUE(at::allclose(lora_w(x, p), baseline::lora_linear(x, p, {}), 1e-5, 1e-5));
}

TEST(Swiglu, MatchesTheFormulaInFp64) {
  const auto e = at::randn({1000}) * 3, g = at::randn({1000}), dh = at::randn({1000});
  const auto e64 = e.to(at::kDouble), g64 = g.to(at::kDouble), dh64 = dh.to(at::kDouble);
  const auto s = at::sigmoid(e64);
  EXPECT_TRUE(at::allclose(swiglu_forward(e, g).to(at::kDouble), e64 * s * g64, 1e-6, 1e-7));
  const auto [de, dg] = swiglu_backward(dh, e, g);
  EXPECT_TRUE(at::allclose(dg.to(at::kDouble), dh64 * e64 * s, 1e-6, 1e-7));
  EXPECT_TRUE(at::allclose(de.to(at::kDouble), dh64 * g64 * s * (1 + e64 * (1 - s)), 1e-5, 1e-6));
  EXPECT_NE(testing::torch_error_of([&] {
              swiglu_forward(e, g.to(at::kHalf));
            }).find("g (up output) is Half"),
            std::string::npos);
}

TEST(Swiglu, HalfRoundsSiluBeforeTheProduct) {
  const auto e = at::randn({4096}).to(at::kBFloat16), g = at::randn({4096}).to(at::kBFloat16);
  const auto silu = (e.to(at::kFloat) * at::sigmoid(e.to(at::kFloat))).to(at::kBFloat16);
  EXPECT_TRUE(
      swiglu_forward(e, g).equal((silu.to(at::kFloat) * g.to(at::kFloat)).to(at::kBFloat16)));
}

// The baseline's dequantization is independent code; it must agree with prod bit for bit.
TEST(BaselineDequant, AgreesWithProdForEveryWidthAndConvention) {
  for (int bits : {2, 3, 4, 8}) {
    for (auto format : {ZeroPointFormat::kGptqV1, ZeroPointFormat::kGptqV2}) {
      QuantizeOptions o;
      o.bits = bits;
      o.group_size = 32;
      o.sym = false;
      o.desc_act = true;
      o.min_zero = 1;
      const auto q = quantize_gptq(at::randn({128, 64}), at::randperm(128, at::kLong), o);
      const auto w = pack_gptq(q, bits, format, at::kBFloat16);
      EXPECT_TRUE(baseline::dequantize(w, at::kHalf).equal(dequantize_gptq(w, at::kHalf)))
          << bits << " bits " << to_string(format);
    }
  }
}

// On CUDA, fp32 adapters beside fp16/bf16 activations run through the adapter-path kernels
// (kernels/src/lora_adapter_cuda.cu); everywhere else through ATen. Both compute the adapter
// path in fp32, so on the same inputs they agree to a few units in the last place of the
// output dtype (y, dX: the kernels round y + term once, the ATen path the term first) and to
// fp32 summation order in dA and dB. Shapes cross the kernels' blocks: tokens not a multiple of
// 64, 128 or 256, features past one 1024-feature chunk, ranks padded to 8, 16 and 32, with and
// without dropout, a rank past the kernels' 32 (the ATen path on both devices), and an empty
// batch.
TEST(LoraOpsCuda, AdapterKernelsMatchTheAtenPath) {
  if (!at::hasCUDA()) {
    if (std::getenv("GRADSCOPE_REQUIRE_CUDA") != nullptr) FAIL() << "no CUDA GPU";
    GTEST_SKIP() << "needs a CUDA GPU";
  }
  struct Config {
    int64_t in, out, rank, tokens;
    at::ScalarType dtype;
    double p;
  };
  at::manual_seed(7);
  for (const auto& c :
       {Config{1056, 520, 7, 300, at::kHalf, 0.0}, Config{64, 2056, 25, 1, at::kBFloat16, 0.1},
        Config{2048, 1024, 32, 515, at::kHalf, 0.1}, Config{256, 136, 16, 2100, at::kBFloat16, 0.0},
        Config{3008, 96, 12, 129, at::kHalf, 0.0}, Config{512, 264, 40, 70, at::kHalf, 0.0},
        Config{128, 64, 16, 0, at::kBFloat16, 0.1}}) {
    const std::string where = "in " + std::to_string(c.in) + ", out " + std::to_string(c.out) +
                              ", rank " + std::to_string(c.rank) + ", tokens " +
                              std::to_string(c.tokens) + ", " + c10::toString(c.dtype) + ", p " +
                              std::to_string(c.p);
    const auto proj = projection(c.in, c.out, c.rank);
    const auto x = at::randn({c.tokens, c.in}).to(c.dtype);
    const auto mask = at::rand({c.tokens, c.in}) >= c.p;
    const auto gy = at::randn({c.tokens, c.out}).to(c.dtype);
    struct Result {
      at::Tensor y, dx, dA, dB;
    };
    const auto run = [&](at::Device device) {
      auto p = proj;
      p.base = proj.base.to(device);
      p.bias = proj.bias.to(device);
      p.lora_A = proj.lora_A.detach().to(device).requires_grad_(true);
      p.lora_B = proj.lora_B.detach().to(device).requires_grad_(true);
      auto xd = x.to(device, /*non_blocking=*/false, /*copy=*/true).requires_grad_(true);
      const LoraDropout dropout = c.p > 0 ? LoraDropout{c.p, mask.to(device)} : LoraDropout{};
      const auto y = lora_w(xd, p, dropout);
      y.backward(gy.to(device));
      return Result{y.detach().cpu().to(at::kFloat), xd.grad().cpu().to(at::kFloat),
                    p.lora_A.grad().cpu(), p.lora_B.grad().cpu()};
    };
    const auto cpu = run(at::kCPU), cuda = run(at::kCUDA);
    const double ulp = c.dtype == at::kHalf ? 1.0 / 1024 : 1.0 / 128;
    const auto expect_close = [&](const char* name, const at::Tensor& got, const at::Tensor& want,
                                  double rtol) {
      if (want.numel() == 0) {  // an empty batch: y and dX empty alike
        EXPECT_EQ(got.sizes(), want.sizes()) << name << " (" << where << ")";
        return;
      }
      const double scale = want.abs().max().item<double>();
      const double err = (got - want).abs().max().item<double>();
      EXPECT_LE(err, rtol * scale) << name << ": max |cuda - cpu| " << err << " against max |cpu| "
                                   << scale << " (" << where << ")";
    };
    expect_close("y", cuda.y, cpu.y, 4 * ulp);
    expect_close("dX", cuda.dx, cpu.dx, 4 * ulp);
    expect_close("dA", cuda.dA, cpu.dA, 1e-4);
    expect_close("dB", cuda.dB, cpu.dB, 1e-4);
  }
}

}  // namespace
}  // namespace gradscope

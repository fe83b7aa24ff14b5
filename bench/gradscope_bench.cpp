// GPU benchmarks of the production kernels against baselines measured in the same run
// (CUDA events, warm-up, median of repeats). Values of the packed words do not change
// the work, so layers are random words drawn on the GPU: no CPU quantization.
//   gradscope_bench [--quick] [--json FILE] [--only dequant|ops]
//                   [--bits N ...] [--act-order on|off] [--out fp16|bf16]  (dequant rows only)
// Prints one table per benchmark; --json writes every row. Exit 2 without a GPU.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cuda/Sleep.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <torch/csrc/autograd/autograd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <iostream>
#include <nlohmann/json.hpp>

#include "gradscope/dequant.h"
#include "gradscope/lora_ops.h"
#include "harness/baseline/aten_baseline.h"
#include "harness/common/cli_parse.h"
#include "reports/output_file.h"

namespace gradscope::bench {
namespace {

constexpr double kPeakBandwidth = 4.8e12;  // H200 datasheet, bytes/s
constexpr double kPeakBf16 = 989e12;       // H200 dense bf16 datasheet, FLOP/s

struct Timing {
  double ms;        // median over repeats
  double peak_gib;  // peak allocated during one call beyond what was allocated before
};

double median(std::vector<double> v) {
  std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
  return v[v.size() / 2];
}

// Median time of `fn` with CUDA events, and its peak allocation from torch's allocator.
Timing measure(const std::function<void()>& fn, int warmup, int repeats) {
  for (int i = 0; i < warmup; ++i) fn();
  c10::cuda::device_synchronize();
  const auto before = c10::cuda::CUDACachingAllocator::getDeviceStats(0).allocated_bytes[0].current;
  c10::cuda::CUDACachingAllocator::resetPeakStats(0);
  fn();
  c10::cuda::device_synchronize();
  const auto peak =
      c10::cuda::CUDACachingAllocator::getDeviceStats(0).allocated_bytes[0].peak - before;
  std::vector<double> ms;
  for (int i = 0; i < repeats; ++i) {
    at::cuda::CUDAEvent start(cudaEventDefault), stop(cudaEventDefault);
    start.record();
    fn();
    stop.record();
    stop.synchronize();
    ms.push_back(start.elapsed_time(stop));
  }
  return {median(ms), static_cast<double>(peak) / (1 << 30)};
}

// The call queued behind a spinning kernel, so that the GPU never waits for the host: the
// events then time the GPU's work alone, and the host's time to issue the call is timed
// apart. A GPU time well below measure()'s means the host (launches, autograd) bounds it.
struct QueuedTiming {
  double gpu_ms;   // median, kernels back to back
  double host_ms;  // median time to issue the call
  bool valid;      // every issue ended before the spin did (else the GPU may have idled)
};

QueuedTiming measure_queued(const std::function<void()>& fn, int repeats) {
  // Spin cycles per millisecond, measured rather than taken from the clock-rate attribute.
  static const double cycles_per_ms = [] {
    constexpr int64_t kCycles = 20'000'000;
    at::cuda::CUDAEvent start(cudaEventDefault), stop(cudaEventDefault);
    at::cuda::sleep(kCycles);  // warm-up
    start.record();
    at::cuda::sleep(kCycles);
    stop.record();
    stop.synchronize();
    return kCycles / static_cast<double>(start.elapsed_time(stop));
  }();
  using Clock = std::chrono::steady_clock;
  const auto issue = [&] {
    const auto t0 = Clock::now();
    fn();
    return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  };
  c10::cuda::device_synchronize();
  const double spin_ms = 1.0 + 3.0 * issue();
  c10::cuda::device_synchronize();
  std::vector<double> gpu, host;
  bool valid = true;
  for (int i = 0; i < repeats; ++i) {
    at::cuda::CUDAEvent start(cudaEventDefault), stop(cudaEventDefault);
    at::cuda::sleep(static_cast<int64_t>(spin_ms * cycles_per_ms));
    start.record();
    host.push_back(issue());
    stop.record();
    stop.synchronize();
    gpu.push_back(start.elapsed_time(stop));
    valid = valid && host.back() < 0.8 * spin_ms;
  }
  return {median(gpu), median(host), valid};
}

// Random packed words of a K x N layer; g_idx contiguous or a seeded act-order permutation.
GptqWeight random_layer(int64_t K, int64_t N, int bits, int group, bool act_order) {
  const auto opts = at::TensorOptions().device(at::kCUDA);
  GptqWeight w;
  w.bits = bits;
  w.format = ZeroPointFormat::kGptqV1;
  const int64_t G = num_groups(K, group);
  w.qweight = at::randint(std::numeric_limits<int32_t>::min(), std::numeric_limits<int32_t>::max(),
                          {K * bits / 32, N}, opts.dtype(at::kInt));
  w.qzeros = at::randint(std::numeric_limits<int32_t>::min(), std::numeric_limits<int32_t>::max(),
                         {G, N * bits / 32}, opts.dtype(at::kInt));
  w.scales = (at::rand({G, N}, opts.dtype(at::kFloat)) * 0.01 + 1e-3).to(at::kHalf);
  const auto rows =
      act_order ? at::randperm(K, opts.dtype(at::kLong)) : at::arange(K, opts.dtype(at::kLong));
  w.g_idx = at::div(rows, group, "floor").to(at::kInt);
  return w;
}

double layer_bytes(const GptqWeight& w, at::ScalarType out) {
  return static_cast<double>(w.qweight.nbytes() + w.qzeros.nbytes() + w.scales.nbytes() +
                             w.g_idx.nbytes()) +
         static_cast<double>(w.in_features() * w.out_features()) * at::elementSize(out);
}

nlohmann::ordered_json bench_copy(int repeats) {
  const auto src =
      at::empty({int64_t{1} << 30}, at::TensorOptions().device(at::kCUDA).dtype(at::kFloat));
  auto dst = at::empty_like(src);
  const auto t = measure([&] { dst.copy_(src); }, 3, repeats);
  const double bytes = 2.0 * src.nbytes();
  std::printf("device-to-device copy of 4 GiB: %.3f ms, %.2f TB/s (%.0f%% of %.1f TB/s)\n\n", t.ms,
              bytes / t.ms / 1e9, 100 * bytes / t.ms / 1e9 / (kPeakBandwidth / 1e12),
              kPeakBandwidth / 1e12);
  return {{"bench", "copy"}, {"bytes", bytes}, {"ms", t.ms}, {"tb_per_s", bytes / t.ms / 1e9}};
}

// Narrows the dequant benchmark to one configuration, e.g. for a profiler run.
struct DequantFilter {
  std::vector<int> bits;  // empty: every width of the run
  std::string act_order;  // "on", "off" or empty (both)
  std::string out;        // "fp16", "bf16" or empty (both)
};

void bench_dequant(bool quick, int repeats, const DequantFilter& only,
                   nlohmann::ordered_json& rows) {
  std::vector<std::pair<int64_t, int64_t>> shapes = {{4096, 4096}, {4096, 11008}, {8192, 28672}};
  std::vector<int> bits = {2, 3, 4, 8};
  if (quick) shapes = {{8192, 28672}}, bits = {3, 4};
  if (!only.bits.empty()) bits = only.bits;
  std::printf("%-13s %4s %4s %5s %10s %9s %7s %10s %9s %9s %9s\n", "dequant K x N", "bits", "act",
              "out", "prod ms", "TB/s", "% peak", "ATen ms", "speed-up", "memset ms", "of memset");
  for (const auto& [K, N] : shapes) {
    for (int b : bits) {
      for (bool act : {false, true}) {
        if (!only.act_order.empty() && act != (only.act_order == "on")) continue;
        const auto w = random_layer(K, N, b, 128, act);
        for (auto out : {at::kHalf, at::kBFloat16}) {
          if (!only.out.empty() && only.out != (out == at::kHalf ? "fp16" : "bf16")) continue;
          const auto prod = measure([&] { dequantize_gptq(w, out); }, 3, repeats);
          const auto aten =
              measure([&] { baseline::dequantize(w, out); }, 2, std::max(3, repeats / 3));
          // The bound the output alone sets: cudaMemsetAsync of the output's bytes (writing
          // them is most of the kernel's traffic), the fastest write the device does.
          auto sink = at::empty({K, N}, at::TensorOptions().device(at::kCUDA).dtype(out));
          const auto fill = measure(
              [&] {
                C10_CUDA_CHECK(cudaMemsetAsync(sink.data_ptr(), 0, sink.nbytes(),
                                               at::cuda::getCurrentCUDAStream()));
              },
              3, repeats);
          const double tbs = layer_bytes(w, out) / prod.ms / 1e9;
          const char* dtype = out == at::kHalf ? "fp16" : "bf16";
          std::printf("%5lldx%-7lld %4d %4s %5s %10.4f %9.2f %6.0f%% %10.3f %8.1fx %9.4f %8.0f%%\n",
                      static_cast<long long>(K), static_cast<long long>(N), b, act ? "on" : "off",
                      dtype, prod.ms, tbs, 100 * tbs * 1e12 / kPeakBandwidth, aten.ms,
                      aten.ms / prod.ms, fill.ms, 100 * fill.ms / prod.ms);
          rows.push_back({{"bench", "dequant"},
                          {"K", K},
                          {"N", N},
                          {"bits", b},
                          {"group_size", 128},
                          {"act_order", act},
                          {"out", dtype},
                          {"prod_ms", prod.ms},
                          {"aten_ms", aten.ms},
                          {"bytes", layer_bytes(w, out)},
                          {"prod_tb_per_s", tbs},
                          {"fraction_of_peak", tbs * 1e12 / kPeakBandwidth},
                          {"speedup_vs_aten", aten.ms / prod.ms},
                          {"memset_ms", fill.ms},
                          {"memset_tb_per_s", static_cast<double>(sink.nbytes()) / fill.ms / 1e9},
                          {"fraction_of_memset", fill.ms / prod.ms}});
        }
      }
    }
  }
  std::printf("\n");
}

LoraProjection random_projection(int64_t in, int64_t out, int64_t rank) {
  LoraProjection p;
  p.base = random_layer(in, out, 4, 128, false);
  const auto opts = at::TensorOptions().device(at::kCUDA).dtype(at::kFloat);
  p.lora_A = (at::randn({rank, in}, opts) / std::sqrt(static_cast<double>(in))).requires_grad_();
  p.lora_B = (at::randn({out, rank}, opts) * 0.01).requires_grad_();
  p.scaling = 16.0 / static_cast<double>(rank);
  return p;
}

// The same op with pre-dequantized dense bf16 weights: the GEMMs a perfect fused op
// cannot avoid, through cuBLAS, plus the adapters.
at::Tensor dense_linear(const at::Tensor& x, const at::Tensor& w_t, const LoraProjection& p) {
  const auto a = p.lora_A.to(x.scalar_type()), b = p.lora_B.to(x.scalar_type());
  return at::matmul(x, w_t) + at::matmul(at::matmul(x, a.t()), b.t()) * p.scaling;
}

struct OpCase {
  std::string op, model;
  int64_t hidden, intermediate, heads, kv_heads;
};

void bench_ops(bool quick, int repeats, nlohmann::ordered_json& rows) {
  std::vector<OpCase> cases = {
      {"lora_w", "llama2-7b", 4096, 11008, 32, 32}, {"qkv", "llama2-7b", 4096, 11008, 32, 32},
      {"mlp", "llama2-7b", 4096, 11008, 32, 32},    {"lora_w", "llama2-70b", 8192, 28672, 64, 8},
      {"qkv", "llama2-70b", 8192, 28672, 64, 8},    {"mlp", "llama2-70b", 8192, 28672, 64, 8}};
  std::vector<int64_t> token_counts = {2048, 8192}, ranks = {16, 32, 64};
  if (quick) token_counts = {2048}, ranks = {16};
  std::printf("%-7s %-10s %6s %4s %9s %9s %7s %9s %9s %7s %9s %9s %9s %9s %7s %9s %9s %9s\n", "op",
              "model", "tokens", "r", "prod ms", "base ms", "speed", "prod GiB", "base GiB",
              "memory", "dense ms", "dense/prod", "gemm ms", "gemm/prod", "gemm %pk", "gpu ms",
              "host ms", "gemm/gpu");
  for (const auto& c : cases) {
    for (int64_t tokens : token_counts) {
      for (int64_t r : ranks) {
        const auto opts = at::TensorOptions().device(at::kCUDA).dtype(at::kBFloat16);
        const int64_t head_dim = c.hidden / c.heads, kv = c.kv_heads * head_dim;
        std::vector<LoraProjection> p;
        if (c.op == "lora_w") p = {random_projection(c.hidden, c.hidden, r)};
        if (c.op == "qkv") {
          p = {random_projection(c.hidden, c.hidden, r), random_projection(c.hidden, kv, r),
               random_projection(c.hidden, kv, r)};
        }
        if (c.op == "mlp") {
          p = {random_projection(c.hidden, c.intermediate, r),
               random_projection(c.hidden, c.intermediate, r),
               random_projection(c.intermediate, c.hidden, r)};
        }
        const auto x = (at::randn({tokens, c.hidden}, opts)).requires_grad_();
        std::vector<at::Tensor> dense;
        for (const auto& q : p) dense.push_back(baseline::dequantize(q.base, at::kBFloat16));
        std::vector<at::Tensor> leaves = {x};
        for (const auto& q : p) leaves.insert(leaves.end(), {q.lora_A, q.lora_B});
        const auto backward = [&](const std::vector<at::Tensor>& outs) {
          std::vector<at::Tensor> grads;
          for (const auto& o : outs) grads.push_back(at::ones_like(o));
          torch::autograd::grad(outs, leaves, grads);
        };
        const LoraDropout none;
        const auto run = [&](int impl) {  // 0 prod, 1 baseline, 2 dense
          std::vector<at::Tensor> outs;
          if (c.op == "lora_w") {
            outs = {impl == 0   ? lora_w(x, p[0])
                    : impl == 1 ? baseline::lora_linear(x, p[0], none)
                                : dense_linear(x, dense[0], p[0])};
          } else if (c.op == "qkv") {
            if (impl == 0) outs = lora_qkv(x, p[0], p[1], p[2]);
            for (int i = 0; impl != 0 && i < 3; ++i) {
              outs.push_back(impl == 1 ? baseline::lora_linear(x, p[i], none)
                                       : dense_linear(x, dense[i], p[i]));
            }
          } else {
            if (impl == 0) outs = {lora_mlp(x, p[0], p[1], p[2])};
            if (impl == 1) outs = {baseline::lora_mlp(x, p[0], p[1], p[2], none, none)};
            if (impl == 2) {
              const auto h =
                  at::silu(dense_linear(x, dense[0], p[0])) * dense_linear(x, dense[1], p[1]);
              outs = {dense_linear(h, dense[2], p[2])};
            }
          }
          backward(outs);
        };
        // The frozen weights' GEMMs alone, dense bf16 through cuBLAS: x W^T forward and dY W
        // for dX backward, per projection (the adapters' rank-r GEMMs are left out). What a
        // fused op cannot go below; the issue's goal is gemm/prod >= 0.8.
        std::vector<at::Tensor> gemm_in, gemm_dy;
        double gemm_flop = 0;
        for (size_t i = 0; i < p.size(); ++i) {
          const int64_t k = dense[i].size(0), n = dense[i].size(1);
          gemm_in.push_back(at::randn({tokens, k}, opts));
          gemm_dy.push_back(at::randn({tokens, n}, opts));
          gemm_flop += 2.0 * 2.0 * static_cast<double>(tokens * k * n);
        }
        const auto gemms = [&] {
          for (size_t i = 0; i < p.size(); ++i) {
            at::mm(gemm_in[i], dense[i]);
            at::mm(gemm_dy[i], dense[i].t());
          }
        };
        const auto prod = measure([&] { run(0); }, 3, repeats);
        const auto prod_queued = measure_queued([&] { run(0); }, repeats);
        const auto base = measure([&] { run(1); }, 3, repeats);
        const auto dense_op = measure([&] { run(2); }, 3, repeats);
        const auto pure = measure(gemms, 3, repeats);
        const double pure_fraction_of_peak = gemm_flop / (pure.ms * 1e-3) / kPeakBf16;
        std::printf(
            "%-7s %-10s %6lld %4lld %9.3f %9.3f %6.2fx %9.3f %9.3f %6.2fx %9.3f %9.2f %9.3f %9.2f "
            "%6.0f%% %9.3f %9.3f %8.2f%s\n",
            c.op.c_str(), c.model.c_str(), static_cast<long long>(tokens),
            static_cast<long long>(r), prod.ms, base.ms, base.ms / prod.ms, prod.peak_gib,
            base.peak_gib, prod.peak_gib / base.peak_gib, dense_op.ms, dense_op.ms / prod.ms,
            pure.ms, pure.ms / prod.ms, 100 * pure_fraction_of_peak, prod_queued.gpu_ms,
            prod_queued.host_ms, pure.ms / prod_queued.gpu_ms, prod_queued.valid ? "" : " (!)");
        rows.push_back({{"bench", "fused_op"},
                        {"op", c.op},
                        {"model", c.model},
                        {"tokens", tokens},
                        {"rank", r},
                        {"dtype", "bf16"},
                        {"prod_ms", prod.ms},
                        {"base_ms", base.ms},
                        {"dense_ms", dense_op.ms},
                        {"speedup_vs_base", base.ms / prod.ms},
                        {"prod_peak_gib", prod.peak_gib},
                        {"base_peak_gib", base.peak_gib},
                        {"memory_ratio", prod.peak_gib / base.peak_gib},
                        {"dense_over_prod", dense_op.ms / prod.ms},
                        {"gemm_ms", pure.ms},
                        {"gemm_over_prod", pure.ms / prod.ms},
                        {"gemm_fraction_of_bf16_peak", pure_fraction_of_peak},
                        {"prod_gpu_ms", prod_queued.gpu_ms},
                        {"prod_host_issue_ms", prod_queued.host_ms},
                        {"prod_gpu_timing_valid", prod_queued.valid},
                        {"gemm_over_prod_gpu", pure.ms / prod_queued.gpu_ms}});
      }
    }
  }
  std::printf(
      "\n(speed = base/prod; memory = prod/base peak allocated during fwd+bwd; dense = the "
      "same op on pre-dequantized bf16 weights, its GEMMs through cuBLAS; gemm = the frozen "
      "weights' two GEMMs per projection alone (x W^T, dY W), goal gemm/prod >= 0.8; gemm %%pk = "
      "their throughput over the bf16 peak %.0f TFLOP/s; gpu ms = prod queued behind a spinning "
      "kernel, the GPU's work without waiting on the host; host ms = the time to issue one "
      "call; (!) = an issue outlasted the spin, gpu ms may include idle time)\n",
      kPeakBf16 / 1e12);
}

}  // namespace
}  // namespace gradscope::bench

int main(int argc, char** argv) {
  CLI::App app{"gradscope_bench: GPU timings of the production kernels against baselines"};
  bool quick = false;
  std::string json_path, only;
  int repeats = 20;
  app.add_flag("--quick", quick, "one shape per benchmark");
  app.add_option("--json", json_path, "write every row to FILE");
  app.add_option("--only", only, "dequant or ops")->check(CLI::IsMember({"dequant", "ops"}));
  app.add_option("--repeats", repeats, "timed repeats per measurement (median)")
      ->check(CLI::Range(3, 1000));
  gradscope::bench::DequantFilter dequant_filter;
  app.add_option("--bits", dequant_filter.bits, "dequant: only these widths")
      ->check(CLI::IsMember({2, 3, 4, 8}));
  app.add_option("--act-order", dequant_filter.act_order, "dequant: only act-order on or off")
      ->check(CLI::IsMember({"on", "off"}));
  app.add_option("--out", dequant_filter.out, "dequant: only this output dtype")
      ->check(CLI::IsMember({"fp16", "bf16"}));
  if (const auto code = gradscope::parse_command_line(app, argc, argv, "gradscope_bench"))
    return *code;
  if (!gradscope::built_with_cuda() || !at::hasCUDA()) {
    std::cerr << "gradscope_bench: error: needs a CUDA GPU and a build with the CUDA kernels\n";
    return 2;
  }
  at::manual_seed(0);
  nlohmann::ordered_json rows = nlohmann::ordered_json::array();
  std::printf("gradscope_bench on %s\n", at::cuda::getCurrentDeviceProperties()->name);
  rows.push_back(gradscope::bench::bench_copy(repeats));
  if (only.empty() || only == "dequant")
    gradscope::bench::bench_dequant(quick, repeats, dequant_filter, rows);
  if (only.empty() || only == "ops") gradscope::bench::bench_ops(quick, repeats, rows);
  if (!json_path.empty()) gradscope::report::write_output_file(json_path, rows.dump(2) + "\n");
  return 0;
}

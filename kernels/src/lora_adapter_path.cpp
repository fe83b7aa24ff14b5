// ATen glue of the adapter-path kernels: checks, layout, workspace, stream, errors.
#include "lora_adapter_path.h"

#include <ATen/ATen.h>

#include <cstdlib>
#include <string_view>

#ifdef GRADSCOPE_WITH_CUDA
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "cuda_glue.h"
#include "lora_adapter_cuda_launch.h"
#endif

namespace gradscope::detail {

#ifdef GRADSCOPE_WITH_CUDA
namespace {
// GRADSCOPE_ADAPTER_KERNELS=off sends every projection through the ATen path, so that a
// benchmark can time both paths on the same build (docs/performance.md); unset or "on": the
// kernels wherever they apply. Read once per process.
bool adapter_kernels_enabled() {
  static const bool enabled = [] {
    const char* value = std::getenv("GRADSCOPE_ADAPTER_KERNELS");
    if (value == nullptr || std::string_view(value) == "on") return true;
    TORCH_CHECK(std::string_view(value) == "off",
                "GRADSCOPE_ADAPTER_KERNELS: expected \"on\" or \"off\", got \"", value, "\"");
    return false;
  }();
  return enabled;
}
}  // namespace
#endif

bool adapter_kernels_apply(const at::Tensor& x2, at::ScalarType adapter_dtype, int64_t rank,
                           int64_t out_features) {
#ifdef GRADSCOPE_WITH_CUDA
  const auto t = x2.scalar_type();
  return x2.is_cuda() && adapter_kernels_enabled() && (t == at::kHalf || t == at::kBFloat16) &&
         adapter_dtype == at::kFloat && rank >= 1 && rank <= cuda::kAdapterMaxRank &&
         x2.size(-1) % 8 == 0 && out_features % 8 == 0;
#else
  (void)x2, (void)adapter_dtype, (void)rank, (void)out_features;
  return false;
#endif
}

#ifdef GRADSCOPE_WITH_CUDA
namespace {

// Contiguous and 16-byte aligned, as the kernels' vector accesses need (a copy otherwise).
at::Tensor packed(const at::Tensor& t) {
  auto c = t.contiguous();
  return reinterpret_cast<uintptr_t>(c.data_ptr()) % 16 == 0 ? c : c.clone();
}

void check(cudaError_t err, const char* what) {
  TORCH_CHECK(err == cudaSuccess, "lora adapter path: CUDA launch of ", what,
              " failed: ", cudaGetErrorString(err));
}

struct Rows {
  at::Tensor x, mask;  // kept alive for the launch
  cuda::AdapterRows view;
};

Rows rows_of(const HalfRows& in) {
  Rows r;
  r.x = packed(in.x);
  r.mask = in.mask.defined() ? packed(in.mask.reshape(in.x.sizes())) : at::Tensor();
  r.view = {r.x.data_ptr(),
            element_type(r.x.scalar_type()),
            r.x.size(0),
            r.x.size(1),
            r.mask.defined() ? static_cast<const uint8_t*>(r.mask.data_ptr()) : nullptr,
            static_cast<float>(in.keep_scale)};
  return r;
}

cuda::AdapterMatrix matrix_of(const at::Tensor& w, bool rank_major) {
  // rank_major: W(j, k) = w[j, k]; else W(j, k) = w[k, j].
  return rank_major ? cuda::AdapterMatrix{w.data_ptr<float>(), w.size(1), 1}
                    : cuda::AdapterMatrix{w.data_ptr<float>(), 1, w.size(1)};
}

int64_t rank_of(const AdapterWeight& w) {
  return w.rank_major ? w.w.size(0) : w.w.size(1);
}

}  // namespace

at::Tensor rows_times_adapter(const HalfRows& x, const AdapterWeight& w) {
  const c10::cuda::CUDAGuard guard(x.x.device());
  const auto rows = rows_of(x);
  const auto weight = w.w.to(at::kFloat).contiguous();
  const auto rank = static_cast<int>(rank_of(w));
  auto out = at::empty({rows.view.tokens, rank}, rows.x.options().dtype(at::kFloat));
  const auto workspace =
      at::empty({cuda::rows_times_adapter_workspace(rows.view.tokens, rows.view.features, rank)},
                out.options());
  check(cuda::launch_rows_times_adapter({rows.view, matrix_of(weight, w.rank_major), rank, 1.0f,
                                         out.data_ptr<float>(), workspace.data_ptr<float>()},
                                        c10::cuda::getCurrentCUDAStream()),
        "rows x adapter");
  return out;
}

void add_low_rank(at::Tensor& y, const LowRankUpdate& u) {
  TORCH_CHECK(y.is_contiguous() && reinterpret_cast<uintptr_t>(y.data_ptr()) % 16 == 0,
              "lora adapter path: the updated tensor must be contiguous and 16-byte aligned");
  const c10::cuda::CUDAGuard guard(y.device());
  const auto p = u.p.to(at::kFloat).contiguous();
  const auto weight = u.w.w.to(at::kFloat).contiguous();
  const auto mask = u.mask.defined() ? packed(u.mask.reshape(y.sizes())) : at::Tensor();
  cuda::AddLowRank args{y.data_ptr(),
                        element_type(y.scalar_type()),
                        y.size(0),
                        y.size(1),
                        p.data_ptr<float>(),
                        matrix_of(weight, u.w.rank_major),
                        static_cast<int>(p.size(1)),
                        mask.defined() ? static_cast<const uint8_t*>(mask.data_ptr()) : nullptr,
                        static_cast<float>(u.alpha)};
  check(cuda::launch_add_low_rank(args, c10::cuda::getCurrentCUDAStream()), "low-rank update");
}

at::Tensor outer_product_sum(const HalfRows& x, const OuterProduct& product) {
  const c10::cuda::CUDAGuard guard(x.x.device());
  const auto rows = rows_of(x);
  const auto p = product.p.to(at::kFloat).contiguous();
  const auto rank = static_cast<int>(p.size(1));
  const int64_t features = rows.view.features;
  const auto options = rows.x.options().dtype(at::kFloat);
  auto out = product.rank_major ? at::empty({rank, features}, options)
                                : at::empty({features, rank}, options);
  if (rows.view.tokens == 0) return out.zero_();
  const auto workspace =
      at::empty({cuda::outer_product_sum_workspace(rows.view.tokens, features, rank)}, options);
  cuda::OuterProductSum args{rows.view,
                             p.data_ptr<float>(),
                             rank,
                             static_cast<float>(product.alpha),
                             out.data_ptr<float>(),
                             product.rank_major ? features : 1,
                             product.rank_major ? 1 : rank,
                             workspace.data_ptr<float>()};
  check(cuda::launch_outer_product_sum(args, c10::cuda::getCurrentCUDAStream()), "outer product");
  return out;
}
#else
at::Tensor rows_times_adapter(const HalfRows&, const AdapterWeight&) {
  TORCH_CHECK(false, "lora adapter path: gradscope was built without CUDA");
}
void add_low_rank(at::Tensor&, const LowRankUpdate&) {
  TORCH_CHECK(false, "lora adapter path: gradscope was built without CUDA");
}
at::Tensor outer_product_sum(const HalfRows&, const OuterProduct&) {
  TORCH_CHECK(false, "lora adapter path: gradscope was built without CUDA");
}
#endif

}  // namespace gradscope::detail

#include "gradscope/gptq_format.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <sstream>
#include <stdexcept>
#include <vector>

#include "gradscope/faults.h"
#include "packed_bits.h"

namespace gradscope {
namespace {

void check_bits(int bits) {
  TORCH_CHECK(is_supported_bits(bits), "gptq: bits must be 2, 3, 4 or 8, got ", bits);
}

void check_int32_matrix(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.defined(), "gptq: ", name, " is undefined");
  TORCH_CHECK(t.dim() == 2, "gptq: ", name, " must be 2-D, got shape ", t.sizes());
  TORCH_CHECK(t.scalar_type() == at::kInt, "gptq: ", name, " must be int32, got ", t.scalar_type());
}

}  // namespace

std::string to_string(ZeroPointFormat format) {
  return format == ZeroPointFormat::kGptqV1 ? "gptq" : "gptq_v2";
}

ZeroPointFormat parse_zero_point_format(const std::string& name) {
  if (name == "gptq") return ZeroPointFormat::kGptqV1;
  if (name == "gptq_v2") return ZeroPointFormat::kGptqV2;
  throw std::invalid_argument("checkpoint format must be \"gptq\" or \"gptq_v2\", got \"" + name +
                              "\"");
}

bool is_supported_bits(int bits) {
  return bits == 2 || bits == 3 || bits == 4 || bits == 8;
}

int64_t num_groups(int64_t in_features, int group_size) {
  return group_size == -1 ? 1 : (in_features + group_size - 1) / group_size;
}

QuantizedWeight quantize_gptq(const at::Tensor& weight_t, const at::Tensor& order,
                              const QuantizeOptions& options) {
  check_bits(options.bits);
  TORCH_CHECK(weight_t.dim() == 2 && at::isFloatingType(weight_t.scalar_type()),
              "gptq quantize: weight_t must be a 2-D float tensor [in, out], got ",
              weight_t.scalar_type(), " ", weight_t.sizes());
  TORCH_CHECK(options.group_size == -1 || options.group_size > 0,
              "gptq quantize: group_size must be -1 or positive, got ", options.group_size);
  const int64_t K = weight_t.size(0), N = weight_t.size(1);
  const int64_t group = options.group_size == -1 ? K : options.group_size;
  const int64_t G = num_groups(K, options.group_size);
  const int maxq = max_code(options.bits);
  TORCH_CHECK(options.min_zero >= 0 && options.min_zero <= maxq,
              "gptq quantize: min_zero must be in [0, ", maxq, "], got ", options.min_zero);

  auto g_idx = at::empty({K}, at::kInt);
  auto g = g_idx.accessor<int32_t, 1>();
  if (options.desc_act && !options.static_groups) {
    TORCH_CHECK(order.defined() && order.dim() == 1 && order.size(0) == K &&
                    order.scalar_type() == at::kLong,
                "gptq quantize: desc_act needs `order`, an int64 permutation of length ", K);
    auto ord = order.cpu().contiguous();
    auto o = ord.accessor<int64_t, 1>();
    std::vector<char> seen(K, 0);
    for (int64_t i = 0; i < K; ++i) {
      TORCH_CHECK(o[i] >= 0 && o[i] < K && !seen[o[i]],
                  "gptq quantize: `order` is not a permutation of 0..", K - 1);
      seen[o[i]] = 1;
      g[o[i]] = static_cast<int32_t>(i / group);
    }
  } else {
    for (int64_t k = 0; k < K; ++k) g[k] = static_cast<int32_t>(k / group);
  }

  auto w = weight_t.detach().to(at::kCPU, at::kFloat).contiguous();
  auto codes = at::empty({K, N}, at::kInt);
  auto zeros = at::empty({G, N}, at::kInt);
  auto scales = at::empty({G, N}, at::kFloat);
  auto wa = w.accessor<float, 2>();
  auto ca = codes.accessor<int32_t, 2>();
  auto za = zeros.accessor<int32_t, 2>();
  auto sa = scales.accessor<float, 2>();

  // Each task owns a block of columns and walks the rows in memory order.
  at::parallel_for(0, N, 256, [&](int64_t begin, int64_t end) {
    const int64_t width = end - begin;
    // GPTQ's quantizer: the range of every group always includes 0.
    std::vector<float> xmin(G * width, 0.f), xmax(G * width, 0.f);
    for (int64_t k = 0; k < K; ++k) {
      float* lo = &xmin[g[k] * width];
      float* hi = &xmax[g[k] * width];
      for (int64_t j = 0; j < width; ++j) {
        lo[j] = std::min(lo[j], wa[k][begin + j]);
        hi[j] = std::max(hi[j], wa[k][begin + j]);
      }
    }
    for (int64_t gi = 0; gi < G; ++gi) {
      for (int64_t j = 0; j < width; ++j) {
        float lo = xmin[gi * width + j], hi = xmax[gi * width + j];
        if (options.sym) {
          hi = std::max(std::abs(lo), hi);
          lo = -hi;
        }
        if (lo == 0.f && hi == 0.f) lo = -1.f, hi = 1.f;
        const float scale = (hi - lo) / static_cast<float>(maxq);
        int zero = options.sym ? (maxq + 1) / 2 : static_cast<int>(std::nearbyint(-lo / scale));
        zero = std::clamp(zero, options.min_zero, maxq);
        sa[gi][begin + j] = scale;
        za[gi][begin + j] = zero;
      }
    }
    for (int64_t k = 0; k < K; ++k) {
      for (int64_t n = begin; n < end; ++n) {
        const float q = std::nearbyint(wa[k][n] / sa[g[k]][n]) + static_cast<float>(za[g[k]][n]);
        ca[k][n] = static_cast<int32_t>(std::clamp(q, 0.f, static_cast<float>(maxq)));
      }
    }
  });
  return {codes, zeros, scales, g_idx};
}

at::Tensor pack_rows(const at::Tensor& codes, int bits) {
  check_bits(bits);
  check_int32_matrix(codes, "codes");
  const int64_t R = codes.size(0), C = codes.size(1);
  TORCH_CHECK((R * bits) % 32 == 0, "gptq pack: ", R, " rows of ", bits,
              "-bit codes do not fill whole int32 words (rows * bits must be a multiple of 32",
              bits == 3 ? "; 3-bit needs rows % 32 == 0)" : ")");
  auto in = codes.cpu().contiguous();
  const int32_t maxq = max_code(bits);
  TORCH_CHECK(R * C == 0 || (in.min().item<int32_t>() >= 0 && in.max().item<int32_t>() <= maxq),
              "gptq pack: codes must lie in [0, ", maxq, "] for ", bits, "-bit packing");
  auto out = at::zeros({R * bits / 32, C}, at::kInt);
  const int32_t* src = in.data_ptr<int32_t>();
  auto* dst = reinterpret_cast<uint32_t*>(out.data_ptr<int32_t>());
  at::parallel_for(0, C, 64, [&](int64_t begin, int64_t end) {
    for (int64_t r = 0; r < R; ++r) {
      const auto pos = packed_bits::locate(r, bits);
      for (int64_t c = begin; c < end; ++c) {
        const auto code = static_cast<uint32_t>(src[r * C + c]);
        dst[pos.word * C + c] |= code << pos.shift;
        if (packed_bits::straddles(pos.shift, bits)) {
          dst[(pos.word + 1) * C + c] |= code >> (32 - pos.shift);
        }
      }
    }
  });
  return out.to(codes.device());
}

at::Tensor unpack_rows(const at::Tensor& packed, int bits, int64_t rows) {
  check_bits(bits);
  check_int32_matrix(packed, "packed words");
  TORCH_CHECK(rows >= 0 && packed.size(0) * 32 == rows * bits, "gptq unpack: ", packed.size(0),
              " packed rows cannot hold ", rows, " rows of ", bits, "-bit codes (expected ",
              rows * bits / 32, " packed rows)");
  const int64_t C = packed.size(1);
  auto in = packed.cpu().contiguous();
  auto out = at::empty({rows, C}, at::kInt);
  const auto* src = reinterpret_cast<const uint32_t*>(in.data_ptr<int32_t>());
  int32_t* dst = out.data_ptr<int32_t>();
  const int64_t words = in.size(0);
  at::parallel_for(0, rows, 64, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const auto pos = packed_bits::locate(r, bits);
      const bool two = packed_bits::straddles(pos.shift, bits) && pos.word + 1 < words;
      for (int64_t c = 0; c < C; ++c) {
        const uint32_t high = two ? src[(pos.word + 1) * C + c] : 0u;
        dst[r * C + c] = static_cast<int32_t>(
            packed_bits::read_field(src[pos.word * C + c], high, pos.shift, bits));
      }
    }
  });
  return out.to(packed.device());
}

at::Tensor pack_columns(const at::Tensor& codes, int bits) {
  check_int32_matrix(codes, "codes");
  return pack_rows(codes.t().contiguous(), bits).t().contiguous();
}

at::Tensor unpack_columns(const at::Tensor& packed, int bits, int64_t columns) {
  check_int32_matrix(packed, "packed words");
  return unpack_rows(packed.t().contiguous(), bits, columns).t().contiguous();
}

at::Tensor encode_zero_points(const at::Tensor& zeros, int bits, ZeroPointFormat format) {
  check_bits(bits);
  check_int32_matrix(zeros, "zeros");
  const int offset = format == ZeroPointFormat::kGptqV1 ? 1 : 0;
  const int32_t maxq = max_code(bits);
  auto stored = (zeros.cpu() - offset).contiguous();
  auto bad = (stored < 0).logical_or(stored > maxq).nonzero();
  if (bad.size(0) > 0) {
    const int64_t g = bad[0][0].item<int64_t>(), n = bad[0][1].item<int64_t>();
    std::ostringstream msg;
    msg << "zero point " << zeros.cpu()[g][n].item<int32_t>() << " of group " << g << ", column "
        << n << " cannot be stored in " << to_string(format) << " " << bits
        << "-bit qzeros (stored field " << stored[g][n].item<int32_t>() << " outside [0, " << maxq
        << "]); " << bad.size(0) << " zero point(s) affected";
    throw std::invalid_argument(msg.str());
  }
  return pack_columns(stored, bits).to(zeros.device());
}

at::Tensor decode_zero_points(const at::Tensor& qzeros, int bits, int64_t columns,
                              ZeroPointFormat format) {
  // Mask first, then add 1 in int32: a v1 field of maxq means zero maxq + 1.
  auto fields = unpack_columns(qzeros, bits, columns);
  return format == ZeroPointFormat::kGptqV1 ? fields + 1 : fields;
}

at::Tensor convert_zero_points(const at::Tensor& qzeros, int bits, int64_t columns,
                               ZeroPointFormat from, ZeroPointFormat to) {
  return encode_zero_points(decode_zero_points(qzeros, bits, columns, from), bits, to);
}

GptqWeight pack_gptq(const QuantizedWeight& q, int bits, ZeroPointFormat format,
                     at::ScalarType scales_dtype) {
  TORCH_CHECK(scales_dtype == at::kHalf || scales_dtype == at::kBFloat16,
              "gptq pack: scales are stored as fp16 or bf16, got ", scales_dtype);
  GptqWeight w;
  w.qweight = pack_rows(q.codes, bits);
  w.qzeros = encode_zero_points(q.zeros, bits, format);
  w.scales = q.scales.to(scales_dtype);
  w.g_idx = q.g_idx.to(at::kInt);
  w.bits = bits;
  w.format = format;
  return w;
}

at::Tensor as_packed_words(const at::Tensor& words_in, const char* name) {
  TORCH_CHECK(words_in.defined(), "gptq: ", name, " is undefined");
  at::Tensor words = words_in;
  if (fault_active(Fault::kFloatViewCast) && at::isFloatingType(words.scalar_type())) {
    // A mixed-precision policy casting the parameter storage and back.
    const auto other = words.scalar_type() == at::kBFloat16 ? at::kHalf : at::kBFloat16;
    words = words.to(other).to(words.scalar_type());
  }
  switch (words.scalar_type()) {
    case at::kInt:
      return words;
    case at::kFloat:
      return words.view(at::kInt);
    case at::kHalf:
    case at::kBFloat16:
      TORCH_CHECK(words.dim() >= 1 && words.size(-1) % 2 == 0 && words.stride(-1) == 1,
                  "gptq: ", name, " is a ", words.scalar_type(),
                  " view of packed int32 words, so its last dimension must be even and "
                  "contiguous; got shape ",
                  words.sizes(), " strides ", words.strides());
      return words.view(at::kInt);
    default:
      TORCH_CHECK(false, "gptq: ", name,
                  " must be int32 packed words or a float32/float16/bfloat16 view of them, got ",
                  words.scalar_type());
  }
}

at::Tensor as_float_view(const at::Tensor& words, at::ScalarType view_dtype) {
  TORCH_CHECK(words.scalar_type() == at::kInt, "gptq: float view needs int32 words, got ",
              words.scalar_type());
  TORCH_CHECK(view_dtype == at::kFloat || view_dtype == at::kHalf || view_dtype == at::kBFloat16,
              "gptq: float view dtype must be float32, float16 or bfloat16, got ", view_dtype);
  return words.view(view_dtype);
}

namespace {

// The g_idx range check reduces on the GPU and waits for the result: a host sync per
// dequant. A training step dequantizes the same frozen layers again and again, so a CUDA
// g_idx already checked and not written since (same storage, view and version counter)
// is not checked again. The weak reference keeps a freed storage's identity from being
// reused by a new tensor while the entry lives.
struct CheckedGIdx {
  c10::weak_intrusive_ptr<c10::StorageImpl> storage;
  int64_t offset, numel, version, groups;
};

std::vector<CheckedGIdx>& checked_g_idx() {
  thread_local std::vector<CheckedGIdx> cache;
  return cache;
}

bool g_idx_already_checked(const at::Tensor& g_idx, int64_t groups) {
  if (!g_idx.is_cuda()) return false;  // a CPU check costs microseconds and no sync
  auto& cache = checked_g_idx();
  for (auto& e : cache) {
    const auto storage = e.storage.lock();
    if (storage.get() == g_idx.storage().unsafeGetStorageImpl() &&
        e.offset == g_idx.storage_offset() && e.numel == g_idx.numel() &&
        e.version == g_idx._version() && e.groups == groups) {
      return true;
    }
  }
  return false;
}

void remember_g_idx_checked(const at::Tensor& g_idx, int64_t groups) {
  if (!g_idx.is_cuda()) return;
  auto& cache = checked_g_idx();
  if (cache.size() >= 256) cache.erase(cache.begin());
  cache.push_back({g_idx.storage().getWeakStorageImpl(), g_idx.storage_offset(), g_idx.numel(),
                   g_idx._version(), groups});
}

}  // namespace

at::Tensor as_stored_words(const at::Tensor& words, at::ScalarType storage_dtype) {
  return storage_dtype == at::kInt ? words : as_float_view(words, storage_dtype);
}

GptqWeight packed_from_storage(const at::Tensor& qweight, const at::Tensor& qzeros,
                               const at::Tensor& scales, const at::Tensor& g_idx, int bits,
                               ZeroPointFormat format) {
  GptqWeight w;
  w.qweight = as_packed_words(qweight, "qweight");
  w.qzeros = as_packed_words(qzeros, "qzeros");
  w.g_idx = as_packed_words(g_idx, "g_idx").view({-1});
  w.scales = scales;
  w.bits = bits;
  w.format = format;
  return w;
}

GptqWeight GptqWeight::to(at::Device device) const {
  GptqWeight w = *this;
  for (at::Tensor* t : {&w.qweight, &w.qzeros, &w.scales, &w.g_idx}) *t = t->to(device);
  return w;
}

void validate_gptq_weight(const GptqWeight& w) {
  check_bits(w.bits);
  const auto qweight = as_packed_words(w.qweight, "qweight");
  const auto qzeros = as_packed_words(w.qzeros, "qzeros");
  check_int32_matrix(qweight, "qweight");
  check_int32_matrix(qzeros, "qzeros");
  TORCH_CHECK(w.g_idx.defined() && w.g_idx.dim() == 1 && w.g_idx.scalar_type() == at::kInt,
              "gptq: g_idx must be a 1-D int32 tensor [in_features]");
  TORCH_CHECK(w.scales.defined() && w.scales.dim() == 2 &&
                  (w.scales.scalar_type() == at::kHalf || w.scales.scalar_type() == at::kBFloat16),
              "gptq: scales must be a 2-D fp16 or bf16 tensor [groups, out_features], got ",
              w.scales.defined() ? c10::toString(w.scales.scalar_type()) : "undefined");
  const int64_t K = w.g_idx.size(0), N = qweight.size(1), G = w.scales.size(0);
  const int b = w.bits;
  TORCH_CHECK(b != 3 || K % 32 == 0, "gptq: 3-bit qweight needs in_features % 32 == 0, got ", K);
  TORCH_CHECK(b != 3 || N % 32 == 0, "gptq: 3-bit qzeros needs out_features % 32 == 0, got ", N);
  TORCH_CHECK(qweight.size(0) * 32 == K * b, "gptq: qweight has ", qweight.size(0),
              " rows; in_features ", K, " at ", b, " bits needs ", K * b / 32.0);
  TORCH_CHECK(w.scales.size(1) == N, "gptq: scales has ", w.scales.size(1),
              " columns, qweight has ", N);
  TORCH_CHECK(qzeros.size(0) == G && qzeros.size(1) * 32 == N * b, "gptq: qzeros has shape ",
              qzeros.sizes(), "; expected [", G, ", ", N * b / 32.0, "]");
  const auto device = qweight.device();
  for (const auto& [t, name] :
       {std::pair{qzeros, "qzeros"}, std::pair{w.scales, "scales"}, std::pair{w.g_idx, "g_idx"}}) {
    TORCH_CHECK(t.device() == device, "gptq: ", name, " is on ", t.device(), " but qweight is on ",
                device);
  }
  if (K > 0 && !g_idx_already_checked(w.g_idx, G)) {
    const auto [lo, hi] = at::aminmax(w.g_idx);
    const int64_t lo_v = lo.item<int64_t>(), hi_v = hi.item<int64_t>();
    TORCH_CHECK(lo_v >= 0 && hi_v < G, "gptq: g_idx values must lie in [0, ", G,
                ") (the number of scale groups), got range [", lo_v, ", ", hi_v, "]");
    remember_g_idx_checked(w.g_idx, G);
  }
}

}  // namespace gradscope

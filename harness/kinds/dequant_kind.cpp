// kind = "dequant": one generated GPTQ layer; prod's packing, unpacking, zero-point
// conventions and dequantization (CPU or CUDA) against the fp64 reference, bit-exact.
#include <ATen/ATen.h>

#include <sstream>
#include <stdexcept>

#include "gradscope/dequant.h"
#include "gradscope/gptq_format.h"
#include "harness/common/dtypes.h"
#include "harness/common/tensor_bridge.h"
#include "harness/generate/gptq_layer_gen.h"
#include "harness/generate/seeded_streams.h"
#include "harness/impl/impl_ops.h"
#include "harness/kinds/field_draws.h"
#include "harness/kinds/kind_decls.h"
#include "harness/verdict/compare.h"
#include "reference/gptq_reference.h"

namespace gradscope {
namespace {

using report::SpecValue;

struct DequantCase {
  int64_t in_features, out_features;
  GptqGenSpec gptq;
  bool edge_codes;
  at::ScalarType dtype;
  std::string storage;  // dtype the packed words are handed to the kernel as
  DequantLayout layout;
  uint64_t seed;
  std::string device;

  explicit DequantCase(const CaseSpec& s)
      : in_features(s.get_int("in_features")),
        out_features(s.get_int("out_features")),
        gptq(s),
        edge_codes(s.get_bool("edge_codes")),
        dtype(dtype_from_name(s.get_string("dtype"))),
        storage(s.get_string("storage")),
        layout(s.get_string("layout") == "out_in" ? DequantLayout::kOutIn : DequantLayout::kInOut),
        seed(static_cast<uint64_t>(s.get_int("seed"))),
        device(s.get_string("device")) {}
};

// v1 -> v2 -> v1 (or v2 -> v1 -> v2) returns the words, or the first conversion
// refuses a zero point the other convention cannot store.
report::Check check_zero_point_roundtrip(const std::string& p, const GptqWeight& packed,
                                         const QuantizedWeight& q, const DequantCase& c) {
  const auto other = c.gptq.format == ZeroPointFormat::kGptqV1 ? ZeroPointFormat::kGptqV2
                                                               : ZeroPointFormat::kGptqV1;
  const std::string path = p + "qzeros_roundtrip_" + to_string(c.gptq.format) + "_" +
                           to_string(other) + "_" + to_string(c.gptq.format);
  const int maxq = max_code(c.gptq.bits);
  const bool representable = other == ZeroPointFormat::kGptqV1
                                 ? q.zeros.min().item<int32_t>() >= 1
                                 : q.zeros.max().item<int32_t>() <= maxq;
  at::Tensor converted;
  std::string refusal;
  try {
    converted =
        convert_zero_points(packed.qzeros, c.gptq.bits, c.out_features, c.gptq.format, other);
  } catch (const std::invalid_argument& e) {
    refusal = e.what();
  }
  if (!representable) {
    return expect_rejection(path,
                            "zero points " + to_string(c.gptq.format) + " cannot store in " +
                                to_string(other) + " must be refused",
                            !refusal.empty(), "");
  }
  if (!refusal.empty()) {
    report::Check failed = expect_rejection(path, "conversion of storable zero points", false, "");
    failed.failure = path + ": conversion refused zero points that are storable: " + refusal;
    return failed;
  }
  const auto back =
      convert_zero_points(converted, c.gptq.bits, c.out_features, other, c.gptq.format);
  return compare_exact(path, "qzeros words after a round trip vs the original words", back,
                       packed.qzeros.to(at::kLong));
}

// generate: the quantized layer, packed; ref: the reference's decode of the packed words;
// prod: the implementation's dequantization on the case's device. Every check is exact.
class DequantTestbed final : public Testbed {
 public:
  explicit DequantTestbed(const CaseContext& context)
      : context_(context), c_(context.spec), own_impl_(context.options.impl == "gradscope") {}

  PhasePlan plan() const override { return {false, false, false}; }

  void generate() override {
    // Words viewed as floats are gradscope's FSDP storage, not part of the operator contract.
    if (!own_impl_ && c_.storage != "int32") {
      throw impl::Unsupported("storage = \"" + c_.storage +
                              "\": the contract hands packed words over as int32");
    }
    q_ = quantize_seeded_layer(c_.seed, "", c_.in_features, c_.out_features, c_.gptq);
    if (c_.edge_codes) plant_edge_values(q_, c_.gptq);
    packed_ = pack_gptq(q_, c_.gptq.bits, c_.gptq.format, c_.gptq.scales_dtype);
  }

  // The reference decodes the packed words on its own.
  void ref() override {
    ref_layer_ = bridge::to_reference(packed_);
    ref_codes_ = reference::decode_codes(ref_layer_);
    ref_zeros_ = reference::decode_zeros(ref_layer_);
    ref_weight_ = bridge::to_tensor(reference::dequantize(ref_layer_));
  }

  // On the case's device, with the packed words in the case's storage dtype.
  void prod() override {
    device_ = at::Device(c_.device == "cuda" ? at::kCUDA : at::kCPU);
    GptqWeight on_device = packed_.to(device_);
    const auto view = scalar_type_of(dtype_facts(c_.storage));
    if (view != at::kInt) {
      on_device.qweight = as_float_view(on_device.qweight, view);
      on_device.qzeros = as_float_view(on_device.qzeros, view);
    }
    prod_weight_ = impl::Ops(context_.options.impl)
                       .dequantize(on_device, c_.dtype,
                                   c_.layout == DequantLayout::kOutIn ? "out_in" : "in_out");
  }

  void verify(CaseResult& out) override;

 private:
  const CaseContext context_;
  const DequantCase c_;
  const bool own_impl_;
  QuantizedWeight q_;
  GptqWeight packed_;
  reference::GptqLayer ref_layer_;
  reference::IntMatrix ref_codes_;
  reference::IntMatrix ref_zeros_;
  at::Tensor ref_weight_, prod_weight_;
  at::Device device_ = at::kCPU;
};

void DequantTestbed::verify(CaseResult& out) {
  const auto& c = c_;
  const int64_t K = c.in_features, N = c.out_features;
  const auto describe = [&, transposed = c.layout ==
                                         DequantLayout::kOutIn](const std::vector<int64_t>& idx) {
    const int64_t k = transposed ? idx[1] : idx[0], n = transposed ? idx[0] : idx[1];
    const int64_t grp = ref_layer_.g_idx[k];
    std::ostringstream d;
    d << "k " << k << ", n " << n << ", code " << ref_codes_(k, n) << ", zero "
      << ref_zeros_(grp, n) << ", group " << grp << ", scale " << ref_layer_.scales[grp * N + n];
    return d.str();
  };
  const auto describe_zero = [&](const std::vector<int64_t>& idx) {
    std::ostringstream d;
    d << "group " << idx[0] << ", column " << idx[1];
    return d.str();
  };

  const std::string p = context_.id + "/gptq/";
  const bool keep = context_.options.keep_tensors;
  std::vector<report::Check> checks;
  const auto ref_codes = bridge::to_tensor(ref_codes_);  // weight-sized: one copy for all checks
  checks.push_back(compare_exact(p + "codes",
                                 "quantizer codes vs reference decode of packed qweight", q_.codes,
                                 ref_codes, describe, keep));
  checks.push_back(compare_exact(p + "zeros", "quantizer zeros vs reference decode of qzeros",
                                 q_.zeros, bridge::to_tensor(ref_zeros_), describe_zero, keep));
  // gradscope's own unpacking and zero-point decoding; another implementation is judged by
  // the weight it dequantizes.
  if (own_impl_) {
    const auto prod_codes = unpack_rows(packed_.qweight, c.gptq.bits, K);
    const auto prod_zeros = decode_zero_points(packed_.qzeros, c.gptq.bits, N, c.gptq.format);
    checks.push_back(compare_exact(p + "unpacked_codes", "prod unpack vs reference decode",
                                   prod_codes, ref_codes, describe, keep));
    checks.push_back(compare_exact(p + "codes_roundtrip",
                                   "quantize -> pack -> unpack vs quantizer codes", prod_codes,
                                   q_.codes, describe, keep));
    checks.push_back(compare_exact(p + "decoded_zeros", "prod zero decode vs reference decode",
                                   prod_zeros, bridge::to_tensor(ref_zeros_), describe_zero, keep));
  }
  const auto ref_in_layout = c.layout == DequantLayout::kOutIn ? ref_weight_.t() : ref_weight_;
  checks.push_back(
      compare_exact(p + "weight",
                    "prod dequant (" + c.device + ") vs fp64 reference rounded once to " +
                        context_.spec.get_string("dtype"),
                    prod_weight_, ref_in_layout, describe, keep, Expected{c.dtype, device_}));
  if (own_impl_) checks.push_back(check_zero_point_roundtrip(p, packed_, q_, c));
  out.checks = std::move(checks);
  if (keep) {
    for (const auto& [name, t] :
         {std::pair{"qweight", packed_.qweight}, std::pair{"qzeros", packed_.qzeros},
          std::pair{"scales", packed_.scales}, std::pair{"g_idx", packed_.g_idx}}) {
      out.inputs.emplace_back(name, bridge::to_tensor_data(t));
    }
  }
}

}  // namespace

KindDecl dequant_kind() {
  KindDecl k;
  k.name = "dequant";
  k.fields = [] {
    const auto s = [](const char* v) { return SpecValue(std::string(v)); };
    std::vector<FieldSpec> f = {
        FieldSpec("in_features", FieldType::kInt, int64_t{256}, "K, rows of W^T")
            .in_range(1, 1 << 20),
        FieldSpec("out_features", FieldType::kInt, int64_t{128}, "N, columns of W^T")
            .in_range(1, 1 << 20),
    };
    for (auto& g : gptq_fields()) f.push_back(std::move(g));
    f.push_back(
        FieldSpec("storage", FieldType::kString, s("int32"),
                  "dtype qweight/qzeros are handed to the kernel as (float = FSDP bit view)")
            .one_of({s("int32"), s("fp32"), s("fp16"), s("bf16")}));
    f.push_back(
        FieldSpec("layout", FieldType::kString, s("in_out"), "output: in_out = W^T, out_in = W")
            .one_of({s("in_out"), s("out_in")}));
    f.push_back(FieldSpec("edge_codes", FieldType::kBool, true,
                          "plant edge codes and extreme zero points"));
    return f;
  }();
  k.prod_ops = {"dequantize"};
  // The reference's fp64 weight and the quantizer's int64 codes, [in, out] each.
  k.host_bytes_at_least = [](const CaseSpec& s) {
    return 16.0 * double(s.get_int("in_features")) * double(s.get_int("out_features"));
  };
  k.case_id = [](const CaseSpec& s) {
    const DequantCase c(s);
    std::ostringstream id;
    id << "dequant." << s.get_string("dtype") << ".k" << c.in_features << "n" << c.out_features
       << "." << c.gptq.id_part();
    if (c.storage != "int32") id << ".view-" << c.storage;
    if (c.layout == DequantLayout::kOutIn) id << ".out-in";
    if (!c.edge_codes) id << ".noedge";
    id << ".s" << c.seed;
    return id.str();
  };
  k.validate = [](const CaseSpec& s) {
    const DequantCase c(s);
    validate_gptq_fields(s);
    validate_gptq_shape(s, c.in_features, c.out_features, "in_features", "out_features");
    const bool half_view = c.storage == "fp16" || c.storage == "bf16";
    if (half_view && (c.out_features % 2 != 0 || (c.out_features * c.gptq.bits / 32) % 2 != 0)) {
      throw_field_error(s, "storage",
                        "'" + c.storage +
                            "' views each int32 word as two halves, so qweight's and "
                            "qzeros' last dimensions must be even (out_features " +
                            std::to_string(c.out_features) + ")");
    }
  };
  k.testbed = [](const CaseContext& c) { return std::make_unique<DequantTestbed>(c); };
  k.sample = [](CaseDraw& d) {
    const int64_t bits = field_draws::gptq(d);
    d.set("in_features", field_draws::width(d, bits, 32, 512));
    d.set("out_features", field_draws::width(d, bits, 32, 512));
    d.set("storage", d.pick<std::string>({"int32", "int32", "fp32", "fp16", "bf16"}));
    d.set("layout", d.chance(0.7) ? "in_out" : "out_in");
    d.set("edge_codes", d.chance(0.7));
  };
  return k;
}

}  // namespace gradscope

#include "harness/cli/checkpoint_commands.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cstdio>
#include <set>
#include <sstream>

#include "gradscope/dequant.h"
#include "harness/catalog/case_file.h"
#include "harness/common/file_system.h"
#include "harness/common/input_error.h"
#include "harness/common/llama_projections.h"
#include "harness/common/tensor_bridge.h"
#include "reports/hdf5_dump.h"

namespace gradscope {
namespace {

std::string toml_string(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

}  // namespace

std::vector<CaseSpec> checkpoint_cases(const CheckpointSelection& sel) {
  const GptqCheckpoint ckpt(sel.dir);
  const auto& d = ckpt.dims();
  const auto& q = ckpt.config();
  std::vector<int64_t> layers = sel.layers.empty() ? std::vector<int64_t>{0} : sel.layers;
  std::set<std::string> projections(sel.projections.begin(), sel.projections.end());
  if (projections.empty()) {
    for (const auto& p : kLlamaProjections) projections.emplace(p.name);
  }
  for (const auto& p : projections) {
    if (!is_llama_projection(p)) {
      throw InputError("--projections: unknown projection '" + p +
                       "'; expected q_proj k_proj v_proj o_proj gate_proj up_proj down_proj");
    }
  }
  const auto wants = [&](std::initializer_list<const char*> names) {
    for (const char* n : names) {
      if (projections.count(n)) return true;
    }
    return false;
  };
  std::vector<CaseSpec> cases;
  for (int64_t layer : layers) {
    if (layer < 0 || layer >= d.layers) {
      throw InputError("--layers: layer " + std::to_string(layer) + " is outside the model's " +
                       std::to_string(d.layers) + " layers");
    }
    struct Kind {
      bool wanted;
      std::string kind, shape;
      std::vector<const char*> modules;
    };
    const Kind kinds[] = {
        {wants({"q_proj", "k_proj", "v_proj"}),
         "qkv",
         "hidden = " + std::to_string(d.hidden) + "\nheads = " + std::to_string(d.heads) +
             "\nkv_heads = " + std::to_string(d.kv_heads) + "\n",
         {"q_proj", "k_proj", "v_proj"}},
        {wants({"o_proj"}),
         "lora_w",
         "in_features = " + std::to_string(d.hidden) +
             "\nout_features = " + std::to_string(d.hidden) + "\n",
         {"o_proj"}},
        {wants({"gate_proj", "up_proj", "down_proj"}),
         "mlp",
         "hidden = " + std::to_string(d.hidden) +
             "\nintermediate = " + std::to_string(d.intermediate) + "\n",
         {"gate_proj", "up_proj", "down_proj"}},
    };
    for (const auto& k : kinds) {
      if (!k.wanted) continue;
      bool bias = false;
      std::string scales = "fp16";
      for (const char* m : k.modules) {  // checked before any case runs: bad files exit 2
        const auto loaded = ckpt.load(module_name(layer, m));
        bias = loaded.bias.defined();
        scales = loaded.weight.scales.scalar_type() == at::kBFloat16 ? "bf16" : "fp16";
      }
      std::ostringstream text;
      text << "kind = \"" << k.kind << "\"\n"
           << k.shape << "checkpoint = " << toml_string(sel.dir) << "\nlayer = " << layer
           << "\nbits = " << q.bits << "\ngroup_size = " << q.group_size
           << "\ndesc_act = " << (q.desc_act ? "true" : "false")
           << "\nstatic_groups = " << (q.static_groups ? "true" : "false")
           << "\nsym = " << (q.sym ? "true" : "false") << "\nformat = \"" << to_string(q.format)
           << "\"\nscales_dtype = \"" << scales << "\"\nbias = " << (bias ? "true" : "false")
           << "\n";
      // The case text is generated, so a line number in it means nothing to the user: each
      // field's origin names the file and key, or the flag, it came from.
      const std::string model = sel.dir + "/" + kCheckpointModelFile;
      const FieldOrigins origins = {
          {"hidden", model + " (hidden_size)"},
          {"in_features", model + " (hidden_size)"},
          {"out_features", model + " (hidden_size)"},
          {"intermediate", model + " (intermediate_size)"},
          {"heads", model + " (num_attention_heads)"},
          {"kv_heads", model + " (num_key_value_heads)"},
          {"checkpoint", "--checkpoint " + sel.dir},
          {"layer", "--layers " + std::to_string(layer)},
          {"bits", q.file + " (bits)"},
          {"group_size", q.file + " (group_size)"},
          {"desc_act", q.file + " (desc_act)"},
          {"static_groups", q.file + " (static_groups)"},
          {"sym", q.file + " (sym)"},
          {"format", q.file + " (checkpoint_format)"},
          {"scales_dtype", sel.dir + " (the dtype of the stored scales)"},
          {"bias", sel.dir + " (whether the modules store a bias)"},
      };
      for (auto& c : parse_case_text(text.str(), sel.dir, origins)) cases.push_back(std::move(c));
    }
  }
  return cases;
}

int command_dequant(std::ostream& out, const std::string& dir, const std::string& module,
                    const std::string& path) {
  if (!files::is_directory(files::parent_directory(path))) {
    throw InputError("--out " + path + ": folder " + files::parent_directory(path) +
                     " does not exist");
  }
  const GptqCheckpoint ckpt(dir);
  const auto layer = ckpt.load(module);
  const auto& w = layer.weight;
  const int64_t K = w.in_features(), N = w.out_features();
  const auto weight = dequantize_gptq(w, at::kFloat, DequantLayout::kOutIn);
  const auto codes = unpack_rows(w.qweight, w.bits, K);
  const auto zeros = decode_zero_points(w.qzeros, w.bits, N, w.format);
  const auto& q = ckpt.config();
  report::write_arrays(path,
                       {{"format", "gradscope-dequant"},
                        {"checkpoint", dir},
                        {"module", module},
                        {"bits", std::to_string(w.bits)},
                        {"group_size", std::to_string(q.group_size)},
                        {"desc_act", q.desc_act ? "true" : "false"},
                        {"checkpoint_format", to_string(w.format)},
                        {"weight_layout", "[out_features, in_features]"}},
                       {{"weight", bridge::to_tensor_data(weight)},
                        {"codes", bridge::to_tensor_data(codes)},
                        {"zeros", bridge::to_tensor_data(zeros)},
                        {"scales", bridge::to_tensor_data(w.scales)},
                        {"g_idx", bridge::to_tensor_data(w.g_idx)}});
  const int maxq = max_code(w.bits);
  const double n = static_cast<double>(codes.numel());
  char line[256];
  out << module << " (" << dir << ")\n";
  std::snprintf(line, sizeof line,
                "  W [%lld, %lld] fp32, %d-bit, group_size %d (%lld groups), %s, act-order %s\n",
                static_cast<long long>(N), static_cast<long long>(K), w.bits, q.group_size,
                static_cast<long long>(w.scales.size(0)), to_string(w.format).c_str(),
                q.desc_act ? "on" : "off");
  out << line;
  std::snprintf(line, sizeof line, "  W: min %.6g  max %.6g  mean %.6g  std %.6g\n",
                weight.min().item<double>(), weight.max().item<double>(),
                weight.mean().item<double>(), weight.std().item<double>());
  out << line;
  std::snprintf(line, sizeof line,
                "  codes at 0: %.3f%%, at maxq %d: %.3f%%; zero points %d..%d; |scale| max %.6g\n",
                100.0 * codes.eq(0).sum().item<int64_t>() / n, maxq,
                100.0 * codes.eq(maxq).sum().item<int64_t>() / n, zeros.min().item<int32_t>(),
                zeros.max().item<int32_t>(), w.scales.abs().max().item<float>());
  out << line << "  wrote " << path << " (weight, codes, zeros, scales, g_idx)\n";
  return 0;
}

int command_export(std::ostream& out, const ExportOptions& options) {
  export_checkpoint(options);
  out << "wrote " << options.dir << ": " << options.layers << " layer(s) x 7 projections, "
      << options.bits << "-bit, group_size " << options.group_size << ", "
      << to_string(options.format) << (options.sym ? ", sym" : ", asym")
      << (options.desc_act ? ", act-order" : "") << ", " << options.shards << " file(s)\n";
  return 0;
}

}  // namespace gradscope

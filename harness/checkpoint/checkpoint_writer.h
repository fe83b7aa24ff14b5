// The project's writer of small GPTQ checkpoints: seeded, quantized layers in the layout
// the reader (checkpoint_reader.h) and peers' loaders read.
#pragma once

#include <cstdint>
#include <string>

#include "gradscope/gptq_format.h"

namespace gradscope {

struct ExportOptions {
  std::string dir;
  int64_t layers = 1, hidden = 256, intermediate = 688, heads = 4, kv_heads = 2;
  int bits = 4;
  int group_size = 128;
  bool desc_act = false, sym = true, static_groups = false;
  ZeroPointFormat format = ZeroPointFormat::kGptqV1;
  uint64_t seed = 1;
  int shards = 1;  // > 1 writes model-0000i-of-0000n.safetensors and the index
};

// Writes a checkpoint of seeded, quantized layers (all 7 projections per layer) into a
// new folder: config.json, quantize_config.json and the safetensors file(s). The folder
// appears complete or not at all.
void export_checkpoint(const ExportOptions& options);

}  // namespace gradscope

// The kinds' declarations, one per file of this folder; catalog/kind_registry.cpp lists them.
#pragma once

#include "harness/engine/case_kind.h"

namespace gradscope {

KindDecl dequant_kind();
KindDecl lora_w_kind();
KindDecl qkv_kind();
KindDecl mlp_kind();
KindDecl layer_kind();
KindDecl training_kind();
KindDecl fsdp_kind();

}  // namespace gradscope

// The runners' factories, one per kind, each defined in its runner's file.
#pragma once

#include <memory>

#include "harness/spec/case_runner.h"

namespace gradscope {

std::unique_ptr<CaseRunner> make_dequant_runner();
std::unique_ptr<CaseRunner> make_lora_w_runner();
std::unique_ptr<CaseRunner> make_qkv_runner();
std::unique_ptr<CaseRunner> make_mlp_runner();
std::unique_ptr<CaseRunner> make_layer_runner();
std::unique_ptr<CaseRunner> make_training_runner();
std::unique_ptr<CaseRunner> make_fsdp_runner();

}  // namespace gradscope

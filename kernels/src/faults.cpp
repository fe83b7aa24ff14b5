#include "gradscope/faults.h"

#include <atomic>

namespace gradscope {
namespace {
std::atomic<Fault> g_active{Fault::kNone};
}  // namespace

const std::vector<FaultInfo>& fault_catalogue() {
  static const std::vector<FaultInfo> catalogue = {
      {Fault::kDropoutRescaleMissing, "dropout-rescale-missing", "lora backward (dX adapter term)",
       "input.grad whenever dropout > 0"},
      {Fault::kLoraScaleMissingInDA, "lora-scale-missing-in-dA", "lora backward (dA)",
       "lora_A.grad whenever the scaling is not 1"},
  };
  return catalogue;
}

void set_active_fault(Fault fault) {
  g_active.store(fault, std::memory_order_relaxed);
}
Fault active_fault() {
  return g_active.load(std::memory_order_relaxed);
}

}  // namespace gradscope

// Run-time fault switches: each turns one piece of production code into a known-
// faulty variant without a rebuild, so the harness can prove it catches that bug.
// Off by default; when off the cost is one relaxed atomic load at the switch point.
#pragma once

#include <string>
#include <vector>

namespace gradscope {

enum class Fault {
  kNone,
  kDropoutRescaleMissing,  // adapter dX multiplied by the mask but not by 1 / (1 - p)
  kLoraScaleMissingInDA,   // dA computed without the LoRA scaling s
};

struct FaultInfo {
  Fault fault;
  const char* name;
  const char* where;
  const char* breaks;
};

const std::vector<FaultInfo>& fault_catalogue();
void set_active_fault(Fault fault);
Fault active_fault();
inline bool fault_active(Fault fault) {
  return active_fault() == fault;
}

// RAII: a fault for one scope (tests).
class ScopedFault {
 public:
  explicit ScopedFault(Fault fault) : previous_(active_fault()) { set_active_fault(fault); }
  ~ScopedFault() { set_active_fault(previous_); }
  ScopedFault(const ScopedFault&) = delete;
  ScopedFault& operator=(const ScopedFault&) = delete;

 private:
  Fault previous_;
};

}  // namespace gradscope

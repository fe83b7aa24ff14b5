// The fault switches' state, compiled twice (kernels/CMakeLists.txt): with
// GRADSCOPE_FAULT_SWITCHES=1 into the object library gradscope_fault_switches, which the CLI
// and the tests link; with 0 into the kernels library itself, whose definitions a program
// that links no switches uses. An archive member is pulled in only for symbols still
// undefined, so a program linking gradscope_fault_switches never pulls the no-switch member.
#include <atomic>
#include <stdexcept>

#include "gradscope/faults.h"

#ifndef GRADSCOPE_FAULT_SWITCHES
#define GRADSCOPE_FAULT_SWITCHES 0
#endif

namespace gradscope {

#if GRADSCOPE_FAULT_SWITCHES
namespace {
std::atomic<Fault> g_active{Fault::kNone};
}  // namespace

bool fault_switches_linked() {
  return true;
}
void set_active_fault(Fault fault) {
  g_active.store(fault, std::memory_order_relaxed);
}
Fault active_fault() {
  return g_active.load(std::memory_order_relaxed);
}
#else
bool fault_switches_linked() {
  return false;
}
void set_active_fault(Fault fault) {
  if (fault != Fault::kNone) {
    throw std::logic_error(
        "this program has no fault switches (they are linked into the gradscope CLI and the "
        "tests when configured with -DGRADSCOPE_WITH_FAULTS=ON; docs/faults.md)");
  }
}
Fault active_fault() {
  return Fault::kNone;
}
#endif

}  // namespace gradscope

// Run-time fault switches: each turns one piece of production code into a known-
// faulty variant without a rebuild, so the harness can prove it catches that bug
// (docs/faults.md). A program gets the switches when it is linked, not compiled: the CLI and
// the tests link gradscope_fault_switches (under the CMake option GRADSCOPE_WITH_FAULTS), and
// everything else, the ops library and the Python extension a user ships among them, the
// kernels library's own no-switch definitions. So one set of objects serves both and the tree
// is compiled once. With the switches a switch point is one relaxed atomic load; without them
// active_fault() is kNone and set_active_fault refuses every fault.
#pragma once

#include <string>
#include <vector>

namespace gradscope {

// Values below kFirstLoraFault are dequantization faults; the CUDA kernel receives them
// as an int, so their numbers are part of the launch interface.
enum class Fault {
  kNone = 0,
  kUnpackShiftOffByOne,      // every code read one bit too high
  kV1ZeroOffsetMissing,      // v1 ("gptq") zero = stored field, the +1 forgotten
  kV1ZeroOffsetTwice,        // v1 zero = stored field + 2
  kGIdxIgnored,              // groups assumed contiguous: g = k * G / K, not g_idx[k]
  kGroupBoundaryOffByOne,    // row k takes the group of row k + 1
  kStraddleHighBitsDropped,  // 3-bit codes 10 and 21 lose the bits in the next word
  kScalesWrongColumn,        // column n scaled by column n + 1's scale
  kFloatViewCast,            // FSDP float view of the words numerically cast and back
  kFirstLoraFault,
  kDropoutRescaleMissing = kFirstLoraFault,  // adapter dX masked but not scaled by 1/(1-p)
  kLoraScaleMissingInDA,                     // dA computed without the LoRA scaling s
  kDAFromUndroppedX,                         // dA from X instead of the dropped X_d
  kDxMissingAdapterTerm,                     // dX = dY W only
  kSwigluDerivativeMissingTerm,  // d silu/de = sigmoid(e), the e (1 - sigmoid(e)) term lost
  kHalfPrecisionAccumulation,    // dA accumulated token by token in the activation dtype
  // Faults that leave every gradient of the step right and break the next step.
  kZerosRewrittenInBackward,  // the v1 -> v2 zero conversion (field + 1) run in place per backward
  kLoraBOverwrittenByGrad,    // dB written into lora_B's own storage
  // Range faults: right on unit inputs, wrong at the magnitudes of real models.
  kRopeTableInActivationDtype,        // positions and angles in x's dtype (bf16: integers <= 256)
  kRmsNormVarianceInActivationDtype,  // mean(x^2) in x's dtype (fp16 x^2 overflows at |x| >= 256)
  kSwigluSigmoidOverflow,             // sigmoid(e) = exp(e) / (1 + exp(e)): NaN for e > 88
  kAdapterPathInActivationDtype,      // fp32 adapters' products rounded to x's dtype: overflows
  // Faults of the interface: a derived quantity or an output's dtype.
  kLoraScalingIgnoresRslora,  // lora_scaling() = alpha / r even for rsLoRA
  kDequantOutputFloat32,      // dequantize returns fp32 whatever dtype was asked for
  kLoraOutputFloat32,         // the fused ops return fp32 outputs for fp16/bf16 inputs
};

struct FaultInfo {
  Fault fault;
  const char* name;
  const char* where;
  const char* breaks;     // what the fault corrupts, in words
  const char* caught_at;  // the check path (substring) a suite must fail on
};

// True in a program linked with gradscope_fault_switches.
bool fault_switches_linked();
const std::vector<FaultInfo>& fault_catalogue();
// nullptr for an unknown name.
const FaultInfo* find_fault(const std::string& name);
// Throws std::logic_error for any fault but kNone in a program without the switches.
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

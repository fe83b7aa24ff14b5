#include "harness/engine/case_kind.h"

#include "harness/common/input_error.h"
#include "harness/engine/judge_device.h"

#include <future>

#ifdef GRADSCOPE_WITH_CUDA
#include <ATen/Context.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#endif

namespace gradscope {

PhaseTimer::PhaseTimer(bool cuda, bool track_memory)
    : cuda_(cuda), track_memory_(track_memory && cuda) {
#ifdef GRADSCOPE_WITH_CUDA
  if (track_memory_) {
    // The caching allocator exists only once CUDA is initialised, which the first CUDA tensor
    // does; a case whose inputs are drawn on the host (dequant) reaches here before any.
    at::globalContext().lazyInitDevice(c10::DeviceType::CUDA);
    c10::cuda::device_synchronize();
    c10::cuda::CUDACachingAllocator::resetPeakStats(0);
  }
#endif
  start_ = std::chrono::steady_clock::now();
}

double PhaseTimer::seconds() {
#ifdef GRADSCOPE_WITH_CUDA
  if (cuda_) c10::cuda::device_synchronize();
#endif
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
}

double PhaseTimer::finish(const std::string& name, Metrics& metrics) {
  const double s = seconds();
#ifdef GRADSCOPE_WITH_CUDA
  if (track_memory_) {
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(0);
    const auto& allocated =
        stats.allocated_bytes[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)];
    metrics.emplace_back(name + ".peak_allocated_gib", allocated.peak / double(1 << 30));
  }
#endif
  metrics.emplace_back(name + ".seconds", s);
  return s;
}

CaseKind::CaseKind(KindDecl decl) : decl_(std::move(decl)) {}

double CaseKind::host_bytes_at_least(const CaseSpec& spec) const {
  return decl_.host_bytes_at_least ? decl_.host_bytes_at_least(spec) : 0.0;
}

std::vector<std::string> CaseKind::prod_ops(const CaseSpec& spec) const {
  return decl_.prod_ops_of_case ? decl_.prod_ops_of_case(spec) : decl_.prod_ops;
}

int64_t CaseKind::processes_needed(const CaseSpec& spec) const {
  return decl_.processes_needed ? decl_.processes_needed(spec) : 0;
}

std::vector<std::pair<std::string, at::Tensor>> CaseKind::generate(
    const CaseSpec& spec, const std::string& id, const RunOptions& options) const {
  const auto testbed = decl_.testbed(CaseContext{spec, id, options});
  testbed->generate();
  auto tensors = testbed->generated();
  if (tensors.empty()) {
    throw InputError(id + ": kind '" + decl_.name + "' does not list its generated tensors");
  }
  return tensors;
}

CaseResult CaseKind::run(const CaseSpec& spec, const std::string& id,
                         const RunOptions& options) const {
  const auto testbed = decl_.testbed(CaseContext{spec, id, options});
  const PhasePlan plan = testbed->plan();
  const bool cuda = spec.get_string("device") == "cuda";
  CaseResult out;
  // prod and base on CUDA also record their peak device memory. Each side writes its own
  // metrics, merged in phase order below.
  const auto phase = [&](const char* name, bool on_device, bool device_memory, Metrics& metrics,
                         void (Testbed::*run)()) {
    if (options.poll) options.poll();
    PhaseTimer timer(on_device, device_memory);
    (testbed.get()->*run)();
    timer.finish(name, metrics);
  };
  Metrics implementation_metrics, judge_metrics;
  // The judges compute on the host, their timers need not wait for the device, but for the
  // floor's large products of squares, handed to the case's GPU and checked on their return;
  // those wait for the baseline's phase to end, whichever thread runs it.
  std::promise<void> base_done;
  std::unique_ptr<JudgeDevice> judge_device;  // after generate: the case's device is usable
  bool base_over = false;
  const auto end_base = [&] {
    if (!base_over) base_done.set_value();
    base_over = true;
  };
  const auto implementations = [&] {
    phase("prod", cuda, true, implementation_metrics, &Testbed::prod);
    if (plan.base) phase("base", cuda, true, implementation_metrics, &Testbed::base);
    end_base();
  };
  const auto judges = [&] {
    const reference::Fp32ProductsOn products(judge_device.get());
    phase("ref", false, false, judge_metrics, &Testbed::ref);
    if (plan.floor) phase("floor", false, false, judge_metrics, &Testbed::floor);
  };
  phase("generate", cuda, false, out.metrics, &Testbed::generate);
  if (cuda && !options.floor_on_host)
    judge_device = cuda_fp32_device(base_done.get_future().share());
  if (plan.judges_first) {
    end_base();  // nothing of the baseline's runs before the judges end
    judges();
    implementations();
  } else if (options.overlap_judges.value_or(cuda)) {
    // prod first, alone: an implementation that declines the case (impl::Unsupported) costs no
    // reference. Then the baseline on the GPU while the fp64 reference and the floor run on the
    // host threads; neither reads what the other writes (docs/architecture.md, "The case engine").
    phase("prod", cuda, true, implementation_metrics, &Testbed::prod);
    auto judged = std::async(std::launch::async, judges);
    try {
      if (plan.base) phase("base", cuda, true, implementation_metrics, &Testbed::base);
      end_base();
    } catch (...) {
      end_base();
      judged.wait();  // the judges use the testbed: it outlives them
      throw;
    }
    judged.get();
  } else {
    implementations();
    judges();
  }
  const auto merge = [&](const Metrics& m) {
    out.metrics.insert(out.metrics.end(), m.begin(), m.end());
  };
  if (judge_device && judge_device->products() > 0) {
    judge_metrics.emplace_back("floor.gpu_products", judge_device->products());
  }
  merge(plan.judges_first ? judge_metrics : implementation_metrics);
  merge(plan.judges_first ? implementation_metrics : judge_metrics);
  testbed->verify(out);
  return out;
}

}  // namespace gradscope

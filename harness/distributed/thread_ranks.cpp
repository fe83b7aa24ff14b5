#include "harness/distributed/thread_ranks.h"

#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#ifdef GRADSCOPE_WITH_CUDA
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include <stdlib.h>

#include <mutex>
#include <optional>
#include <stdexcept>
#include <thread>

namespace gradscope {
namespace {

c10::intrusive_ptr<c10d::Backend> make_backend(c10::DeviceType device_type,
                                               const c10::intrusive_ptr<c10d::Store>& store,
                                               int rank, int world, std::chrono::seconds timeout) {
#ifdef GRADSCOPE_WITH_CUDA
  if (device_type == c10::DeviceType::CUDA) {
    auto opts = c10d::ProcessGroupNCCL::Options::create();
    opts->timeout = timeout;
    return c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, world, opts);
  }
#endif
  if (device_type != c10::DeviceType::CPU) {
    throw std::invalid_argument("thread ranks: no process group for device type " +
                                c10::DeviceTypeName(device_type));
  }
  auto opts = c10d::ProcessGroupGloo::Options::create(timeout);
  opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
  return c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, world, opts);
}

}  // namespace

std::vector<std::string> run_thread_ranks(int world, c10::DeviceType device_type,
                                          std::chrono::seconds timeout, const RankBody& body) {
  // PyTorch's flight recorder (one per process, on by default) inserts a group into its
  // status map outside its lock, at the group's first collective: groups on concurrent
  // threads corrupt the map (ASan in CI: SEGV in _Rb_tree_insert_and_rebalance under
  // FlightRecorder::recordWithResetEnabled, torch 2.11; 1 in a few hundred runs). It is a
  // post-mortem aid for multi-process jobs. The recorder reads this once, when the process's
  // first group records: the CLI and the tests make groups only here, so this comes first;
  // before the threads start because setenv is not thread safe.
  setenv("TORCH_FR_BUFFER_SIZE", "0", 1);
  const auto store = c10::make_intrusive<c10d::HashStore>();
  std::vector<std::string> errors(world);
  // Every rank's group, so that a failing rank aborts them all: a peer blocked in a collective
  // that the failed rank will never join gets out only when its own communicator is aborted
  // (else it waits until NCCL's watchdog takes the whole process down).
  std::mutex groups_mutex;
  std::vector<c10::intrusive_ptr<c10d::Backend>> groups(world);
  bool any_failed = false;  // guarded by groups_mutex
  const auto abort_all = [&] {
    const std::lock_guard<std::mutex> lock(groups_mutex);
    if (any_failed) return;
    any_failed = true;
    for (auto& g : groups) {
      if (g) g->abort();
    }
  };
  const auto done_key = [](int i) { return "thread_ranks/done/" + std::to_string(i); };
  const auto rank_main = [&](int r) {
    const auto failed = [&](const std::exception& e, const std::string& where) {
      const auto* c10_error = dynamic_cast<const c10::Error*>(&e);
      const std::string what = c10_error ? c10_error->what_without_backtrace() : e.what();
      if (errors[r].empty()) {
        errors[r] = where + (what.empty() ? "an exception without a message" : what);
      }
      abort_all();
    };
#ifdef GRADSCOPE_WITH_CUDA
    std::optional<c10::cuda::CUDAGuard> guard;  // outlives the group: its teardown is on GPU r
#endif
    try {
#ifdef GRADSCOPE_WITH_CUDA
      if (device_type == c10::DeviceType::CUDA) guard.emplace(static_cast<c10::DeviceIndex>(r));
#endif
      const auto backend = make_backend(device_type, store, r, world, timeout);
      {
        const std::lock_guard<std::mutex> lock(groups_mutex);
        groups[r] = backend;
        if (any_failed) backend->abort();  // another rank failed before this one started
      }
      body(r, backend);
#ifdef GRADSCOPE_WITH_CUDA
      // NCCL's wait() only orders streams: the body can return with its last collectives
      // still running on the GPU. A ProcessGroupNCCL destroyed without shutdown aborts its
      // communicators, in-flight collectives included (its destructor's own comment warns
      // that this corrupts results in libtorch programs: the first fsdp case of a process
      // would get only rank 0's part of the gradients and the peer an ncclSystemError).
      if (device_type == c10::DeviceType::CUDA) c10::cuda::device_synchronize();
#endif
    } catch (const std::exception& e) {
      failed(e, "");
    }
    // No rank tears its group down while a peer may still be in a collective with it; a rank
    // that failed arrives too, so that the others do not wait out the timeout. All shut down
    // (a graceful destroy, which NCCL may make every rank of the node take part in), or, if
    // any rank failed, all groups were aborted already.
    try {
      store->set(done_key(r), std::vector<uint8_t>{errors[r].empty() ? uint8_t{1} : uint8_t{0}});
      std::vector<std::string> keys;
      for (int i = 0; i < world; ++i) keys.push_back(done_key(i));
      store->wait(keys, timeout);
      bool all_ok = true;
      for (const auto& k : keys) all_ok = all_ok && store->get(k) == std::vector<uint8_t>{1};
      c10::intrusive_ptr<c10d::Backend> to_shut_down;
      {
        const std::lock_guard<std::mutex> lock(groups_mutex);
        if (all_ok && !any_failed) std::swap(to_shut_down, groups[r]);  // abort_all: not this one
      }
      if (to_shut_down) to_shut_down->shutdown();
    } catch (const std::exception& e) {
      store->set(done_key(r),
                 std::vector<uint8_t>{0});  // a rank still to arrive must not shut down
      failed(e, "leaving with the other ranks: ");
    }
  };
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    try {
      threads.emplace_back(rank_main, r);
    } catch (...) {
      // The ranks that started finish (or fail) and are joined: a joinable std::thread
      // destroyed would terminate the process. Those that did not start count as failed.
      for (int i = r; i < world; ++i) store->set(done_key(i), std::vector<uint8_t>{0});
      abort_all();
      for (auto& t : threads) t.join();
      throw;
    }
  }
  for (auto& t : threads) t.join();
  return errors;
}

}  // namespace gradscope

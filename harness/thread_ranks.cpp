#include "harness/thread_ranks.h"

#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#ifdef GRADSCOPE_WITH_CUDA
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include <stdlib.h>

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
  std::vector<std::thread> threads;
  // A thread that cannot start leaves the others to finish (or time out) and be joined: a
  // joinable std::thread destroyed would terminate the process.
  const auto join_all = [&] {
    for (auto& t : threads) t.join();
  };
  for (int r = 0; r < world; ++r) {
    try {
      threads.emplace_back([&, r] {
        const auto failed = [&](const std::exception& e, const std::string& where) {
          const auto* c10_error = dynamic_cast<const c10::Error*>(&e);
          const std::string what = c10_error ? c10_error->what_without_backtrace() : e.what();
          if (errors[r].empty())
            errors[r] = where + (what.empty() ? "an exception without a message" : what);
        };
        c10::intrusive_ptr<c10d::Backend> backend;
#ifdef GRADSCOPE_WITH_CUDA
        std::optional<c10::cuda::CUDAGuard> guard;  // held through the shutdown below
#endif
        try {
#ifdef GRADSCOPE_WITH_CUDA
          if (device_type == c10::DeviceType::CUDA) guard.emplace(static_cast<c10::DeviceIndex>(r));
#endif
          backend = make_backend(device_type, store, r, world, timeout);
          body(r, backend);
#ifdef GRADSCOPE_WITH_CUDA
          // NCCL's wait() only orders streams: the body can return with its last collectives
          // still running on the GPU. A ProcessGroupNCCL destroyed without shutdown aborts its
          // communicators, in-flight collectives included (its destructor's own comment warns
          // that this corrupts results in libtorch programs; r14-r21: the first fsdp case of a
          // process got only rank 0's part of the gradients, the peer an ncclSystemError, a
          // later case a hung reduce-scatter).
          if (device_type == c10::DeviceType::CUDA) c10::cuda::device_synchronize();
#endif
        } catch (const std::exception& e) {
          failed(e, "");
        }
        // No rank tears its group down while a peer may still be in a collective with it; a
        // rank that failed arrives too, so that the others do not wait out the timeout. All
        // shut down (a graceful destroy), or, if any rank failed, all abort: a destroy that
        // waits for a peer which aborted could hang.
        try {
          const auto key = [](int i) { return "thread_ranks/done/" + std::to_string(i); };
          store->set(key(r), std::vector<uint8_t>{errors[r].empty() ? uint8_t{1} : uint8_t{0}});
          std::vector<std::string> keys;
          for (int i = 0; i < world; ++i) keys.push_back(key(i));
          store->wait(keys, timeout);
          bool all_ok = true;
          for (const auto& k : keys) all_ok = all_ok && store->get(k) == std::vector<uint8_t>{1};
          if (backend && all_ok) {
            backend->shutdown();
          } else if (backend) {
            backend->abort();
          }
        } catch (const std::exception& e) {
          failed(e, "leaving with the other ranks: ");
        }
      });
    } catch (...) {
      join_all();
      throw;
    }
  }
  join_all();
  return errors;
}

}  // namespace gradscope

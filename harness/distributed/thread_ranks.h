// Ranks as threads of one process, each with its own c10d backend over one in-memory store:
// ProcessGroupGloo on the CPU, ProcessGroupNCCL with GPU r current for rank r on CUDA. The fsdp
// kind and the sharding tests launch their ranks through this one function.
#pragma once

#include <c10/core/DeviceType.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>

#include <chrono>
#include <functional>
#include <string>
#include <vector>

namespace gradscope {

using RankBody = std::function<void(int rank, const c10::intrusive_ptr<c10d::Backend>& backend)>;

// Runs `body` on `world` threads and joins them all. Returns what each rank threw (its
// what()), "" for a rank that returned. `timeout` bounds every collective. The ranks leave
// together: each waits for its device's work (CUDA), then for every other rank, and only then
// shuts its group down. A rank that fails aborts every rank's group, so that none waits in a
// collective that the failed rank will never join.
std::vector<std::string> run_thread_ranks(int world, c10::DeviceType device_type,
                                          std::chrono::seconds timeout, const RankBody& body);

}  // namespace gradscope

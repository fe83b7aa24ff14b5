// One process per rank, as torchrun launches them (srun or mpirun with the same variables
// too): the launch read from RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT, one
// c10d TCPStore shared by the processes, and process groups made from it: Gloo on the CPU,
// NCCL on GPU LOCAL_RANK. Nothing here assumes one host. docs/distributed.md.
#pragma once

#include <c10/core/DeviceType.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace gradscope {

struct ProcessLaunch {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  std::string master_addr;
  uint16_t master_port = 0;
  // torchrun's agent already serves the store at MASTER_ADDR:MASTER_PORT
  // (TORCHELASTIC_USE_AGENT_STORE=True): every rank connects as a client. Otherwise rank 0
  // serves it, as torch.distributed's env:// initialisation does.
  bool agent_store = false;
};

// The launch the environment describes, or none when WORLD_SIZE is unset (a plain run).
// Throws InputError naming the variable that is missing or malformed.
std::optional<ProcessLaunch> process_launch_from_environment();

// A rank that failed, died or did not answer in time: the run cannot be judged.
struct RankFailure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

class ProcessRanks {
 public:
  // Connects to (rank 0 without an agent: serves) the store; `timeout` bounds every wait for
  // another rank and every collective.
  ProcessRanks(const ProcessLaunch& launch, std::chrono::seconds timeout);
  ~ProcessRanks();
  ProcessRanks(const ProcessRanks&) = delete;
  ProcessRanks& operator=(const ProcessRanks&) = delete;

  int rank() const { return launch_.rank; }
  int world_size() const { return launch_.world_size; }
  int local_rank() const { return launch_.local_rank; }
  std::chrono::seconds timeout() const { return timeout_; }

  // A new process group over every rank, under its own key prefix `name` (unique per group):
  // Gloo on the CPU, NCCL with GPU LOCAL_RANK on CUDA. Every rank must make it.
  c10::intrusive_ptr<c10d::Backend> new_group(c10::DeviceType device_type, const std::string& name);

  // This rank's value under `key`, for the ranks that collect it.
  void publish(const std::string& key, const std::string& value);
  // The value under `key` of each rank in `from` (every rank when empty; this one included
  // if it published), indexed by rank ("" for a rank not asked). Throws RankFailure naming
  // each rank that reported a failure (fail()) or did not publish within the timeout.
  std::vector<std::string> collect(const std::string& key, const std::vector<int>& from = {});
  // Tells the other ranks that this one failed (they stop waiting for it).
  void fail(const std::string& message);

  // While a Watch lives, this process ends (exit code 2, after a message naming `what`) if it
  // outlasts the timeout by more than a grace period: c10d's own timeouts do not cover every
  // wait (Gloo waiting to connect to a peer that published its address and died blocks past
  // them), and a rank stuck there would never leave.
  class Watch {
   public:
    Watch(ProcessRanks& ranks, std::string what);
    ~Watch();
    Watch(const Watch&) = delete;
    Watch& operator=(const Watch&) = delete;

   private:
    ProcessRanks& ranks_;
  };

 private:
  std::string key_of(const std::string& key, int rank) const;
  void watchdog();
  ProcessLaunch launch_;
  std::chrono::seconds timeout_;
  c10::intrusive_ptr<c10d::Store> store_;
  // The watched operation (guarded by mutex_): what it is and when it must have ended.
  std::mutex mutex_;
  std::condition_variable wake_;
  std::string watched_;
  std::optional<std::chrono::steady_clock::time_point> deadline_;
  bool stopping_ = false;
  std::thread watchdog_;
};

}  // namespace gradscope

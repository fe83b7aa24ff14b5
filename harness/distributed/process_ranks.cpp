#include "harness/distributed/process_ranks.h"

#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#ifdef GRADSCOPE_WITH_CUDA
#include <c10/cuda/CUDAFunctions.h>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include <cstdio>
#include <cstdlib>
#include <thread>

#include "harness/common/input_error.h"

namespace gradscope {
namespace {

std::optional<std::string> env(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr) return std::nullopt;
  return std::string(v);
}

int64_t env_int(const char* name, int64_t lo, int64_t hi, const std::string& what) {
  const auto v = env(name);
  if (!v) {
    throw InputError(std::string(name) + " is not set: a launch with WORLD_SIZE set needs RANK, " +
                     "LOCAL_RANK, MASTER_ADDR and MASTER_PORT too (torchrun sets them all)");
  }
  size_t used = 0;
  int64_t value = 0;
  try {
    value = std::stoll(*v, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != v->size() || value < lo || value > hi) {
    throw InputError(std::string(name) + "=" + *v + ": expected " + what);
  }
  return value;
}

std::string what_of(const std::exception& e) {
  const auto* c10_error = dynamic_cast<const c10::Error*>(&e);
  return c10_error ? c10_error->what_without_backtrace() : e.what();
}

}  // namespace

std::optional<ProcessLaunch> process_launch_from_environment() {
  if (!env("WORLD_SIZE")) return std::nullopt;
  ProcessLaunch l;
  l.world_size = static_cast<int>(env_int("WORLD_SIZE", 1, 1 << 16, "a positive integer"));
  l.rank = static_cast<int>(
      env_int("RANK", 0, l.world_size - 1,
              "an integer in [0, WORLD_SIZE - 1 = " + std::to_string(l.world_size - 1) + "]"));
  l.local_rank = static_cast<int>(env_int("LOCAL_RANK", 0, 1 << 16, "a non-negative integer"));
  l.master_port = static_cast<uint16_t>(env_int("MASTER_PORT", 1, 65535, "a port in [1, 65535]"));
  l.master_addr = env("MASTER_ADDR").value_or("");
  if (l.master_addr.empty()) {
    throw InputError("MASTER_ADDR is not set: the host serving the ranks' store is needed");
  }
  l.agent_store = env("TORCHELASTIC_USE_AGENT_STORE").value_or("") == "True";
  return l;
}

ProcessRanks::ProcessRanks(const ProcessLaunch& launch, std::chrono::seconds timeout)
    : launch_(launch), timeout_(timeout) {
  c10d::TCPStoreOptions opts;
  opts.port = launch.master_port;
  opts.isServer = !launch.agent_store && launch.rank == 0;
  opts.numWorkers = launch.world_size;
  opts.waitWorkers = false;
  opts.multiTenant = true;
  opts.timeout = timeout;
  try {
    store_ = c10::make_intrusive<c10d::PrefixStore>(
        "gradscope", c10::make_intrusive<c10d::TCPStore>(launch.master_addr, opts));
  } catch (const std::exception& e) {
    throw RankFailure("rank " + std::to_string(launch.rank) + ": cannot reach the store at " +
                      launch.master_addr + ":" + std::to_string(launch.master_port) + ": " +
                      what_of(e));
  }
  watchdog_ = std::thread([this] { watchdog(); });
}

ProcessRanks::~ProcessRanks() {
  {
    const std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (watchdog_.joinable()) watchdog_.join();
}

void ProcessRanks::watchdog() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stopping_) {
    if (deadline_ && std::chrono::steady_clock::now() > *deadline_) {
      std::fprintf(stderr,
                   "gradscope: error: rank %d: %s did not end within --dist-timeout %lld s (and "
                   "a grace of 10 s): another rank died or stalled; exiting\n",
                   rank(), watched_.c_str(), static_cast<long long>(timeout_.count()));
      std::fflush(stderr);
      std::_Exit(2);  // the stuck thread cannot be unwound
    }
    wake_.wait_for(lock, std::chrono::milliseconds(500));
  }
}

ProcessRanks::Watch::Watch(ProcessRanks& ranks, std::string what) : ranks_(ranks) {
  const std::lock_guard<std::mutex> lock(ranks_.mutex_);
  ranks_.watched_ = std::move(what);
  ranks_.deadline_ = std::chrono::steady_clock::now() + ranks_.timeout_ + std::chrono::seconds(10);
}

ProcessRanks::Watch::~Watch() {
  const std::lock_guard<std::mutex> lock(ranks_.mutex_);
  ranks_.deadline_.reset();
}

c10::intrusive_ptr<c10d::Backend> ProcessRanks::new_group(c10::DeviceType device_type,
                                                          const std::string& name) {
  const auto store = c10::make_intrusive<c10d::PrefixStore>(name, store_);
  publish(name + "/joining", "");  // so that a group that cannot form names who is missing
  try {
#ifdef GRADSCOPE_WITH_CUDA
    if (device_type == c10::DeviceType::CUDA) {
      c10::cuda::set_device(static_cast<c10::DeviceIndex>(launch_.local_rank));
      auto opts = c10d::ProcessGroupNCCL::Options::create();
      opts->timeout = timeout_;
      return c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank(), world_size(), opts);
    }
#endif
    if (device_type != c10::DeviceType::CPU) {
      throw std::invalid_argument("no process group for device type " +
                                  c10::DeviceTypeName(device_type));
    }
    auto opts = c10d::ProcessGroupGloo::Options::create(timeout_);
    opts->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
    return c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank(), world_size(), opts);
  } catch (const std::exception& e) {
    std::string missing;
    try {
      for (int r = 0; r < world_size(); ++r) {
        if (!store_->check({key_of(name + "/joining", r)})) {
          missing += (missing.empty() ? "" : ", ") + std::to_string(r);
        }
      }
    } catch (const std::exception&) {
      missing = "unknown (the store is gone)";
    }
    throw RankFailure("rank " + std::to_string(rank()) + ": the process group for " + name +
                      " could not form (timeout " + std::to_string(timeout_.count()) + " s): " +
                      (missing.empty()
                           ? "every rank began to join, and one died or stalled while joining"
                           : "rank(s) " + missing + " never came (died, or still busy)") +
                      "; c10d: " + what_of(e));
  }
}

std::string ProcessRanks::key_of(const std::string& key, int rank) const {
  return key + "/" + std::to_string(rank);
}

void ProcessRanks::publish(const std::string& key, const std::string& value) {
  store_->set(key_of(key, rank()), std::vector<uint8_t>(value.begin(), value.end()));
}

void ProcessRanks::fail(const std::string& message) {
  try {
    store_->set(key_of("failed", rank()), std::vector<uint8_t>(message.begin(), message.end()));
  } catch (const std::exception&) {
    // The store is gone with its server: the others find out from their own waits.
  }
}

std::vector<std::string> ProcessRanks::collect(const std::string& key,
                                               const std::vector<int>& from) {
  const auto deadline = std::chrono::steady_clock::now() + timeout_;
  std::vector<std::string> values(world_size());
  std::vector<bool> have(world_size(), !from.empty());
  for (int r : from) have.at(r) = false;
  const auto as_string = [](const std::vector<uint8_t>& v) {
    return std::string(v.begin(), v.end());
  };
  try {
    for (;;) {
      std::string failed, missing;
      for (int r = 0; r < world_size(); ++r) {
        if (!have[r] && store_->check({key_of(key, r)})) {
          values[r] = as_string(store_->get(key_of(key, r)));
          have[r] = true;
        }
        if (!have[r] && store_->check({key_of("failed", r)})) {
          failed += "\n  rank " + std::to_string(r) +
                    " failed: " + as_string(store_->get(key_of("failed", r)));
        }
        if (!have[r]) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
      }
      if (!failed.empty())
        throw RankFailure("ranks failed while rank " + std::to_string(rank()) + " waited for " +
                          key + ":" + failed);
      if (missing.empty()) return values;
      if (std::chrono::steady_clock::now() > deadline) {
        throw RankFailure("rank " + std::to_string(rank()) + " waited " +
                          std::to_string(timeout_.count()) + " s for " + key + " from rank(s) " +
                          missing + ", which did not answer (died, or slower than --dist-timeout)");
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  } catch (const RankFailure&) {
    throw;
  } catch (const std::exception& e) {
    throw RankFailure("rank " + std::to_string(rank()) + " lost the store while waiting for " +
                      key + " (its server, rank 0 or torchrun, gone?): " + what_of(e));
  }
}

}  // namespace gradscope

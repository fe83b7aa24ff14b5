// Peak memory of one FSDP rank loading a GPTQ decoder layer (7 projections) from a checkpoint,
// two ways, each in its own child process so that its peak is its own:
//   whole   - load() each module whole on the host, move it to the device, then shard it
//             (what the fsdp kind did before: a full copy on the device, if briefly);
//   sharded - shard_checkpoint_module: qweight's words copied out of the mapped file only
//             where the rank's shards lie, straight to the device.
// Host peak: VmHWM (resident: anonymous memory and touched pages of the mapped file) over the
// child's resident size before loading. Device peak: torch's allocator. Ratio sharded/whole.
//   gradscope_shard_load_bench [--dir CKPT | --hidden H --intermediate I ...] [--world 2,4,8]
//                              [--device cpu|cuda] [--view bf16] [--json FILE]
// Without --dir a checkpoint of one layer is exported to a temporary folder first.
#include <ATen/ATen.h>
#include <sys/wait.h>
#include <unistd.h>
#ifdef GRADSCOPE_WITH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#endif

#include <CLI/CLI.hpp>
#include <cinttypes>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>

#include "harness/checkpoint/checkpoint_shards.h"
#include "harness/checkpoint/checkpoint_writer.h"
#include "harness/common/cli_parse.h"
#include "harness/common/dtypes.h"
#include "harness/common/file_system.h"
#include "reports/output_file.h"

namespace gradscope::bench {
namespace {

// A backend that only knows its rank and world size: sharding reads nothing else, and one
// rank's loading is measured alone.
class RankOnlyBackend : public c10d::Backend {
 public:
  using Backend::Backend;
  const std::string getBackendName() const override { return "rank-only"; }
};

// A field of /proc/self/status in bytes (its values are kB).
int64_t status_bytes(const std::string& field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(field + ":", 0) == 0) return std::stoll(line.substr(field.size() + 1)) * 1024;
  }
  throw std::runtime_error("/proc/self/status has no " + field);
}

struct Peak {
  int64_t host = 0, device = 0, held = 0;  // held: bytes of the shards kept at the end
};

Peak load_rank(const std::string& dir, bool sharded, int world, at::ScalarType view,
               at::Device device) {
  const GptqCheckpoint ckpt(dir);
  const auto backend = c10::make_intrusive<RankOnlyBackend>(0, world);
  // Warm-up: ATen's first operations and thread pools have a resident cost of their own
  // (tens of MiB) that is neither way's; checking one module's small tensors pays it.
  if (!ckpt.modules().empty()) ckpt.load_without_qweight(ckpt.modules().front());
#ifdef GRADSCOPE_WITH_CUDA
  // Likewise the CUDA context, and the allocator must exist before its peak is reset.
  if (device.is_cuda()) at::empty({1}, at::TensorOptions().device(device));
#endif
  const int64_t before = status_bytes("VmRSS");
#ifdef GRADSCOPE_WITH_CUDA
  if (device.is_cuda()) c10::cuda::CUDACachingAllocator::resetPeakStats(device.index());
#endif
  std::vector<ShardedModule> kept;
  for (const auto& module : ckpt.modules()) {
    if (sharded) {
      kept.push_back(shard_checkpoint_module(ckpt, module, view, ShardingStrategy::kPerParameter,
                                             backend, device));
      continue;
    }
    const auto layer = ckpt.load(module);
    const auto w = layer.weight.to(device);
    ShardedModule m;
    m.parameters = {as_stored_words(w.qweight, view), as_stored_words(w.qzeros, view), w.scales,
                    as_stored_words(w.g_idx, view)};
    if (layer.bias.defined()) m.parameters.push_back(layer.bias.to(device));
    m.shards =
        std::make_unique<ShardedParameters>(m.parameters, ShardingStrategy::kPerParameter, backend);
    kept.push_back(std::move(m));
  }
  Peak p;
  p.host = status_bytes("VmHWM") - before;
  for (const auto& m : kept) {
    for (const auto& s : m.shards->shards()) p.held += static_cast<int64_t>(s.nbytes());
  }
#ifdef GRADSCOPE_WITH_CUDA
  if (device.is_cuda()) {
    p.device =
        c10::cuda::CUDACachingAllocator::getDeviceStats(device.index()).allocated_bytes[0].peak;
  }
#endif
  return p;
}

// Runs load_rank in a fresh process: this program again, with --measure. Exec, not a bare
// fork: a forked child of a process whose OpenMP and ATen thread pools have run deadlocks in
// its first parallel region.
Peak measure_in_child(const std::string& self, const std::string& dir, bool sharded, int world,
                      const std::string& view, const std::string& device) {
  int fds[2];
  if (pipe(fds) != 0) throw std::runtime_error("pipe failed");
  std::fflush(nullptr);
  const std::vector<std::string> args = {self,
                                         "--measure",
                                         sharded ? "sharded" : "whole",
                                         "--dir",
                                         dir,
                                         "--world",
                                         std::to_string(world),
                                         "--view",
                                         view,
                                         "--device",
                                         device};
  std::vector<char*> argv;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  const pid_t pid = fork();
  if (pid < 0) {
    close(fds[0]);
    close(fds[1]);
    throw std::runtime_error("fork failed");
  }
  if (pid == 0) {
    close(fds[0]);
    dup2(fds[1], STDOUT_FILENO);
    execv(self.c_str(), argv.data());
    _exit(127);
  }
  close(fds[1]);
  std::string text;
  char buf[256];
  for (ssize_t n; (n = read(fds[0], buf, sizeof buf)) > 0;) text.append(buf, n);
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  Peak p;
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0 ||
      std::sscanf(text.c_str(), "%" SCNd64 " %" SCNd64 " %" SCNd64, &p.host, &p.device, &p.held) !=
          3) {
    const std::string how = WIFSIGNALED(status)
                                ? "killed by signal " + std::to_string(WTERMSIG(status))
                                : "exit status " + std::to_string(WEXITSTATUS(status));
    throw std::runtime_error(std::string("the ") + (sharded ? "sharded" : "whole") +
                             " load of world " + std::to_string(world) + " failed (" + how + ")");
  }
  return p;
}

double mib(int64_t bytes) {
  return static_cast<double>(bytes) / (1 << 20);
}

}  // namespace
}  // namespace gradscope::bench

int main(int argc, char** argv) {
  using namespace gradscope;
  CLI::App app{"gradscope_shard_load_bench: peak memory of one rank loading a layer's shards"};
  std::string dir, device_name = "cpu", view_name = "bf16", json_path, worlds_text = "2,4,8";
  ExportOptions e;
  e.hidden = 8192;  // Llama-2-70B
  e.intermediate = 28672;
  e.heads = 64;
  e.kv_heads = 8;
  app.add_option("--dir", dir, "an existing GPTQ checkpoint (default: export one layer)");
  app.add_option("--hidden", e.hidden, "exported layer's hidden size")->check(CLI::PositiveNumber);
  app.add_option("--intermediate", e.intermediate, "exported layer's MLP size")
      ->check(CLI::PositiveNumber);
  app.add_option("--heads", e.heads)->check(CLI::PositiveNumber);
  app.add_option("--kv-heads", e.kv_heads)->check(CLI::PositiveNumber);
  app.add_option("--bits", e.bits)->check(CLI::IsMember({2, 3, 4, 8}));
  app.add_option("--group-size", e.group_size);
  app.add_option("--world", worlds_text, "comma-separated world sizes");
  app.add_option("--device", device_name)->check(CLI::IsMember({"cpu", "cuda"}));
  app.add_option("--view", view_name, "storage of the packed words: int32, fp32, fp16, bf16");
  app.add_option("--json", json_path, "write every row to FILE");
  std::string measure;  // the child's part: one load, its figures on stdout
  app.add_option("--measure", measure)->check(CLI::IsMember({"whole", "sharded"}))->group("");
  if (const auto code =
          gradscope::parse_command_line(app, argc, argv, "gradscope_shard_load_bench"))
    return *code;
  try {
    const auto view = view_name == "int32" ? at::kInt : dtype_from_name(view_name);
    const at::Device device(device_name == "cuda" ? at::kCUDA : at::kCPU, 0);
    std::vector<int> worlds;
    for (size_t at = 0; at <= worlds_text.size();) {
      const size_t comma = std::min(worlds_text.find(',', at), worlds_text.size());
      const std::string item = worlds_text.substr(at, comma - at);
      size_t used = 0;
      int world = 0;
      try {
        world = std::stoi(item, &used);
      } catch (const std::exception&) {
      }
      if (item.empty() || used != item.size() || world < 1) {
        throw std::invalid_argument("--world: expected comma-separated sizes >= 1, got \"" +
                                    worlds_text + "\"");
      }
      worlds.push_back(world);
      at = comma + 1;
    }
    if (!measure.empty()) {
      const auto p = bench::load_rank(dir, measure == "sharded", worlds.front(), view, device);
      std::printf("%" PRId64 " %" PRId64 " %" PRId64 "\n", p.host, p.device, p.held);
      return 0;
    }
    // This program, for the measuring children.
    char self_path[4096];
    const ssize_t len = readlink("/proc/self/exe", self_path, sizeof self_path - 1);
    if (len <= 0) throw std::runtime_error("cannot read /proc/self/exe");
    const std::string self(self_path, static_cast<size_t>(len));
    // The exported checkpoint goes, whatever happens after.
    struct Scratch {
      std::string dir;
      ~Scratch() {
        if (!dir.empty()) files::remove_tree(dir);
      }
    } scratch;
    if (dir.empty()) {
      scratch.dir = files::make_temp_dir("gradscope-shard-load");
      e.dir = scratch.dir + "/ckpt";
      std::printf("exporting one %" PRId64 "/%" PRId64 " layer (%d-bit, group %d) ...\n", e.hidden,
                  e.intermediate, e.bits, e.group_size);
      std::fflush(stdout);
      export_checkpoint(e);
      dir = e.dir;
    }
    if (GptqCheckpoint(dir).modules().empty()) {  // also fails early on a bad folder
      throw std::invalid_argument(dir + ": no GPTQ module (no tensor named *.qweight)");
    }
    nlohmann::ordered_json rows = nlohmann::ordered_json::array();
    std::printf("%-6s %14s %14s %8s %14s %14s %8s %12s\n", "world", "whole host", "sharded host",
                "ratio", "whole device", "sharded dev", "ratio", "held");
    for (const int world : worlds) {
      const auto whole = bench::measure_in_child(self, dir, false, world, view_name, device_name);
      const auto sharded = bench::measure_in_child(self, dir, true, world, view_name, device_name);
      const double host_ratio = static_cast<double>(sharded.host) / whole.host;
      const double device_ratio =
          whole.device ? static_cast<double>(sharded.device) / whole.device : 0.0;
      std::printf("%-6d %10.1f MiB %10.1f MiB %8.3f %10.1f MiB %10.1f MiB %8.3f %8.1f MiB\n", world,
                  bench::mib(whole.host), bench::mib(sharded.host), host_ratio,
                  bench::mib(whole.device), bench::mib(sharded.device), device_ratio,
                  bench::mib(sharded.held));
      rows.push_back({{"world", world},
                      {"device", device_name},
                      {"view", view_name},
                      {"whole_host_bytes", whole.host},
                      {"sharded_host_bytes", sharded.host},
                      {"host_ratio", host_ratio},
                      {"whole_device_bytes", whole.device},
                      {"sharded_device_bytes", sharded.device},
                      {"device_ratio", device_ratio},
                      {"held_bytes", sharded.held}});
    }
    std::printf(
        "\n(one rank, FSDP2 per-parameter shards, packed words as %s; host = VmHWM over VmRSS "
        "before loading: anonymous memory plus the touched pages of the mapped file; device = "
        "torch's allocator peak; held = the rank's shards; ratio = sharded / whole)\n",
        view_name.c_str());
    if (!json_path.empty()) report::write_output_file(json_path, rows.dump(2) + "\n");
  } catch (const std::exception& ex) {
    std::cerr << "gradscope_shard_load_bench: error: " << ex.what() << "\n";
    return 2;
  }
  return 0;
}

#include "harness/impl/impl_ops.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <torch/csrc/jit/frontend/function_schema_parser.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <exception>

#include "harness/common/input_error.h"

namespace gradscope::impl {
namespace {

std::function<void()>& after_case_hook() {
  static std::function<void()> hook;
  return hook;
}

std::string without_name(const c10::FunctionSchema& s) {
  std::string text = c10::toString(s);
  const auto paren = text.find('(');
  return paren == std::string::npos ? text : text.substr(paren);
}

// Types in order: the call is positional, so names and defaults do not matter.
bool same_types(const std::vector<c10::Argument>& a, const std::vector<c10::Argument>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (*a[i].type() != *b[i].type()) return false;
  }
  return true;
}

c10::OperatorHandle find(const std::string& ns, const std::string& name) {
  auto op = c10::Dispatcher::singleton().findOp({ns + "::" + name, ""});
  if (!op || !op->hasSchema()) {
    throw InputError("implementation '" + ns + "' has no operator " + ns + "::" + name +
                     " (expected " + ns + "::" + op_schema(name).schema + ")");
  }
  return *op;
}

bool is_not_implemented(const std::exception& e) {
  if (dynamic_cast<const c10::NotImplementedError*>(&e) != nullptr) return true;
  // A Python kernel's exception arrives as its text: "NotImplementedError: ...".
  const std::string what = e.what();
  return what.rfind("NotImplementedError", 0) == 0 ||
         what.find("\nNotImplementedError") != std::string::npos;
}

torch::jit::Stack call(const std::string& ns, const std::string& name, torch::jit::Stack stack) {
  const auto op = [&] {
    try {
      return find(ns, name);
    } catch (const InputError& e) {
      if (!op_schema(name).optional) throw;
      throw Unsupported(std::string(e.what()) + "; an optional operator (docs/implementations.md)");
    }
  }();
  try {
    op.callBoxed(&stack);
  } catch (const std::exception& e) {
    if (is_not_implemented(e)) throw Unsupported(ns + "::" + name + ": " + e.what());
    throw;
  }
  return stack;
}

c10::List<at::Tensor> projection_list(const LoraProjection& p) {
  c10::List<at::Tensor> t(
      {p.base.qweight, p.base.qzeros, p.base.scales, p.base.g_idx, p.lora_A, p.lora_B});
  if (p.bias.defined()) t.push_back(p.bias);
  return t;
}

c10::IValue mask_of(const LoraDropout& d) {
  return d.p > 0 && d.mask.defined() ? c10::IValue(d.mask) : c10::IValue();
}

// The trial load's child writes why it failed here.
int g_trial_report_fd = -1;

[[noreturn]] void report_trial_failure() {
  std::string why = "an exception that is not a std::exception";
  if (const auto e = std::current_exception()) {
    try {
      std::rethrow_exception(e);
    } catch (const std::exception& x) {
      why = x.what();
    } catch (...) {
    }
  }
  why = why.substr(0, why.find('\n'));  // c10::Error appends a backtrace
  // torch's text for a namespace defined twice goes on to advice that does not apply here.
  if (why.rfind("Only a single TORCH_LIBRARY", 0) == 0) why = why.substr(0, why.find(';'));
  [[maybe_unused]] const auto n = ::write(g_trial_report_fd, why.data(), why.size());
  ::_exit(3);
}

// dlopen as a pointer whose type may throw. glibc declares dlopen noexcept, so a compiler may
// drop the handler around a direct call, and an exception from a library's initialiser then
// passes a catch written there (clang does) or terminates. volatile: the call stays indirect.
using OpenLibrary = void* (*)(const char*, int);
volatile OpenLibrary g_open_library = ::dlopen;

// Ends the trial child however its frame is left: an exception that escaped every handler in
// it still unwinds this, and the child never returns into its caller's code.
struct ChildExit {
  ~ChildExit() { ::_exit(5); }
};

// A library's static initialisers run inside dlopen, and an exception from one cannot unwind
// through it: the process terminates. torch throws there when a second TORCH_LIBRARY block
// defines a namespace (a copy of a library already loaded, or of gradscope's own operators).
// So each library is loaded first in a forked child; what ends the child is reported as the
// input error it is, and only a library that loads there is loaded here. Empty: it loaded.
std::string trial_load(const std::string& path) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return {};
  const pid_t pid = ::fork();
  if (pid < 0) {
    ::close(fds[0]);
    ::close(fds[1]);
    return {};
  }
  if (pid == 0) {
    ::close(fds[0]);
    g_trial_report_fd = fds[1];
    std::set_terminate(report_trial_failure);
    // A failure to load at all is reported by the real dlopen, with its dlerror text. The
    // exception may also unwind out of dlopen: it is caught here, and the child never returns
    // into the caller's code.
    const ChildExit guard;
    try {
      const OpenLibrary open_library = g_open_library;
      ::_exit(open_library(path.c_str(), RTLD_NOW | RTLD_GLOBAL) == nullptr ? 4 : 0);
    } catch (...) {
      report_trial_failure();
    }
  }
  ::close(fds[1]);
  std::string why;
  char buf[512];
  for (ssize_t n; (n = ::read(fds[0], buf, sizeof buf)) != 0;) {
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) break;
    why.append(buf, static_cast<size_t>(n));
  }
  ::close(fds[0]);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (WIFEXITED(status) && (WEXITSTATUS(status) == 0 || WEXITSTATUS(status) == 4)) return {};
  if (WIFEXITED(status) && WEXITSTATUS(status) == 3) return "its initialisation threw: " + why;
  if (WIFEXITED(status) && WEXITSTATUS(status) == 5) {
    return "its initialisation threw an exception that could not be caught";
  }
  if (WIFSIGNALED(status)) {
    return std::string("its initialisation was killed by signal ") +
           std::to_string(WTERMSIG(status)) + " (" + ::strsignal(WTERMSIG(status)) + ")";
  }
  return "its initialisation ended the process with exit code " +
         std::to_string(WEXITSTATUS(status));
}

}  // namespace

void set_after_case(std::function<void()> hook) {
  after_case_hook() = std::move(hook);
}

void after_case() {
  if (after_case_hook()) after_case_hook()();
}

const OpSchema& op_schema(const std::string& name) {
  for (const auto& op : kOpSchemas) {
    if (name == op.name) return op;
  }
  throw std::invalid_argument("no operator '" + name + "' in the contract");
}

void load_libraries(const std::vector<std::string>& paths) {
  for (const auto& path : paths) {
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) {
      throw InputError("--ops-library " + path + ": not a file");
    }
    const std::string failed = trial_load(path);
    if (!failed.empty()) {
      throw InputError("--ops-library " + path + ": cannot load it: " + failed +
                       (failed.find("TORCH_LIBRARY") != std::string::npos
                            ? " (is it a copy of a library already loaded, or of gradscope's "
                              "own operators, which this program registers itself?)"
                            : ""));
    }
    // Global symbols, as torch.ops.load_library: a library may rely on another's. It loaded in
    // the child; an initialiser that throws here all the same is caught as an input error.
    void* handle = nullptr;
    try {
      const OpenLibrary open_library = g_open_library;
      handle = open_library(path.c_str(), RTLD_NOW | RTLD_GLOBAL);
    } catch (const std::exception& e) {
      const std::string what = e.what();
      throw InputError("--ops-library " + path + ": cannot load it: its initialisation threw: " +
                       what.substr(0, what.find('\n')));
    }
    if (handle == nullptr) {
      const char* why = ::dlerror();
      throw InputError("--ops-library " + path + ": cannot load it: " + (why ? why : "unknown"));
    }
  }
}

// Whether `ns` registers any operator of the contract.
bool registers_any(const std::string& ns) {
  for (const auto& op : kOpSchemas) {
    const auto found = c10::Dispatcher::singleton().findOp({ns + "::" + op.name, ""});
    if (found && found->hasSchema()) return true;
  }
  return false;
}

// What could have registered `impl.ns`, for a missing operator's message.
std::string registration_hint(const ImplChoice& impl) {
  if (impl.is_default()) return "";
  std::string given;
  for (const auto& lib : impl.libraries) given += " --ops-library " + lib;
  for (const auto& mod : impl.imports) given += " --import " + mod;
  if (given.empty()) {
    return "\n  nothing was loaded to register '" + impl.ns +
           "': give the shared library that registers it (--ops-library FILE) or, through "
           "the Python package, the module that does (python3 -m gradscope run ... --import "
           "MODULE)";
  }
  return "\n  loaded:" + given + "; none of them registers this operator in namespace '" + impl.ns +
         "' (a misspelt namespace, or a registration that failed at import)";
}

void require_ops(const ImplChoice& impl, const std::vector<std::string>& ops) {
  if (!op_registration_linked()) throw std::logic_error("gradscope's operators are not linked");
  const std::string& ns = impl.ns;
  for (const auto& name : ops) {
    const auto registered = c10::Dispatcher::singleton().findOp({ns + "::" + name, ""});
    // Left out, an optional operator makes the cases that call it unsupported (call()); but a
    // namespace with none of the contract's operators is a misspelling or a failed
    // registration, refused below as any missing operator is.
    if (op_schema(name).optional && !(registered && registered->hasSchema()) && registers_any(ns)) {
      continue;
    }
    c10::OperatorHandle op = [&] {
      try {
        return find(ns, name);
      } catch (const InputError& e) {
        throw InputError(e.what() + registration_hint(impl));
      }
    }();
    const auto expected = torch::jit::parseSchema(op_schema(name).schema);
    const auto& actual = op.schema();
    if (!same_types(actual.arguments(), expected.arguments()) ||
        !same_types(actual.returns(), expected.returns())) {
      throw InputError("implementation '" + ns + "': " + ns + "::" + name +
                       " has a different signature\n  registered: " + without_name(actual) +
                       "\n  expected:   " + without_name(expected) + "\n  (schema version " +
                       std::to_string(kOpSchemaVersion) + ", docs/implementations.md)");
    }
  }
}

LayerLoraOps layer_ops(const Ops& ops, const LoraArgs& args) {
  LayerLoraOps l;
  l.qkv = [ops, args](const at::Tensor& x, const LoraProjection& q, const LoraProjection& k,
                      const LoraProjection& v) { return ops.lora_qkv(x, q, k, v, args, {}); };
  l.w = [ops, args](const at::Tensor& x, const LoraProjection& o) {
    return ops.lora_w(x, o, args, {});
  };
  l.mlp = [ops, args](const at::Tensor& x, const LoraProjection& gate, const LoraProjection& up,
                      const LoraProjection& down) {
    return ops.lora_mlp(x, gate, up, down, args, {}, {});
  };
  return l;
}

at::Tensor Ops::dequantize(const GptqWeight& w, at::ScalarType dtype,
                           const std::string& layout) const {
  auto out = call(ns_, "dequantize",
                  {w.qweight, w.qzeros, w.scales, w.g_idx, static_cast<int64_t>(w.bits),
                   to_string(w.format), dtype, layout});
  return out.at(0).toTensor();
}

at::Tensor Ops::lora_w(const at::Tensor& x, const LoraProjection& proj, const LoraArgs& args,
                       const LoraDropout& dropout) const {
  auto out =
      call(ns_, "lora_w",
           {x, projection_list(proj), static_cast<int64_t>(proj.base.bits),
            to_string(proj.base.format), args.alpha, args.rslora, mask_of(dropout), dropout.p});
  return out.at(0).toTensor();
}

std::vector<at::Tensor> Ops::lora_qkv(const at::Tensor& x, const LoraProjection& q,
                                      const LoraProjection& k, const LoraProjection& v,
                                      const LoraArgs& args, const LoraDropout& dropout) const {
  auto out = call(ns_, "lora_qkv",
                  {x, projection_list(q), projection_list(k), projection_list(v),
                   static_cast<int64_t>(q.base.bits), to_string(q.base.format), args.alpha,
                   args.rslora, mask_of(dropout), dropout.p});
  auto list = out.at(0).toTensorVector();
  if (list.size() != 3) {
    throw std::runtime_error(ns_ + "::lora_qkv returned " + std::to_string(list.size()) +
                             " tensors, expected 3 (q, k, v)");
  }
  return list;
}

at::Tensor Ops::lora_mlp(const at::Tensor& x, const LoraProjection& gate, const LoraProjection& up,
                         const LoraProjection& down, const LoraArgs& args,
                         const LoraDropout& dropout_x, const LoraDropout& dropout_h) const {
  auto out = call(
      ns_, "lora_mlp",
      {x, projection_list(gate), projection_list(up), projection_list(down),
       static_cast<int64_t>(gate.base.bits), to_string(gate.base.format), args.alpha, args.rslora,
       mask_of(dropout_x), mask_of(dropout_h), std::max(dropout_x.p, dropout_h.p)});
  return out.at(0).toTensor();
}

at::Tensor Ops::decoder_layer(const at::Tensor& x, const DecoderLayer& l,
                              const LoraArgs& args) const {
  const auto& keys = kDecoderLayerKeys;
  c10::Dict<std::string, at::Tensor> norms;
  norms.insert(keys.norms[0], l.input_norm);
  norms.insert(keys.norms[1], l.post_attention_norm);
  c10::Dict<std::string, c10::List<at::Tensor>> projections;
  const LoraProjection* in_key_order[] = {&l.q, &l.k, &l.v, &l.o, &l.gate, &l.up, &l.down};
  for (size_t i = 0; i < std::size(keys.projections); ++i) {
    projections.insert(keys.projections[i], projection_list(*in_key_order[i]));
  }
  c10::Dict<std::string, int64_t> sizes;
  sizes.insert("heads", l.heads);
  sizes.insert("kv_heads", l.kv_heads);
  sizes.insert("position_offset", l.position_offset);
  c10::Dict<std::string, double> values;
  values.insert("rms_eps", l.norm_eps);
  values.insert("rope_theta", l.rope_theta);
  values.insert("attention_scale", attention_scale(l, l.input_norm.size(0) / l.heads));
  values.insert("residual_multiplier", l.residual_multiplier);
  values.insert("rope_factor", l.rope_factor);
  values.insert("rope_low_freq_factor", l.rope_low_freq_factor);
  values.insert("rope_high_freq_factor", l.rope_high_freq_factor);
  values.insert("rope_original_max_position", l.rope_original_max_position);
  auto out =
      call(ns_, "decoder_layer",
           {x, norms, projections, static_cast<int64_t>(l.q.base.bits), to_string(l.q.base.format),
            args.alpha, args.rslora, l.family, l.rope_type, sizes, values});
  return out.at(0).toTensor();
}

}  // namespace gradscope::impl

#include "harness/spec/model_family.h"

#include <cctype>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <set>

#include <sys/stat.h>

#include "harness/common/file_system.h"
#include "harness/common/input_error.h"
#include "harness/spec/toml_text.h"

namespace gradscope {
namespace {

// What gradscope models of each part (docs/model-families.md): a declaration asking for
// anything else is refused when read, not judged against the wrong reference.
const std::set<std::string> kNormKinds = {"rms"};
const std::set<std::string> kRopeTypes = {"default", "llama3"};
const std::set<std::string> kMasks = {"causal"};
const std::set<std::string> kActivations = {"silu"};
const std::vector<std::string> kSelfAttn = {"q_proj", "k_proj", "v_proj", "o_proj"};
const std::vector<std::string> kMlp = {"gate_proj", "up_proj", "down_proj"};

bool identifier(const std::string& s) {
  if (s.empty() || s.size() > 64 ||
      !(std::isalpha(static_cast<unsigned char>(s[0])) || s[0] == '_'))
    return false;
  for (const char c : s) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_')) return false;
  }
  return true;
}

std::string joined(const std::vector<std::string>& v) {
  std::string out;
  for (const auto& s : v) out += (out.empty() ? "" : ", ") + s;
  return out;
}

// One table of a declaration: each key read once, the rest refused by name.
class Table {
 public:
  Table(const toml::table& t, std::string file, std::string prefix)
      : t_(t), file_(std::move(file)), prefix_(std::move(prefix)) {}

  [[noreturn]] void fail(const std::string& key, const std::string& what) const {
    const toml::node* n = t_.get(key);
    const std::string line = n ? ":" + std::to_string(n->source().begin.line) : "";
    throw InputError(file_ + line + ": " + prefix_ + key + " " + what);
  }

  const toml::node& node(const std::string& key) {
    read_.insert(key);
    const toml::node* n = t_.get(key);
    if (!n) throw InputError(file_ + ": " + prefix_ + key + " is missing");
    return *n;
  }

  std::string string(const std::string& key) {
    const auto* s = node(key).as_string();
    if (!s) fail(key, "must be a string");
    return s->get();
  }

  std::string one_of(const std::string& key, const std::set<std::string>& allowed) {
    auto v = string(key);
    if (!allowed.count(v)) {
      fail(key, "is '" + v + "'; gradscope models " +
                    joined(std::vector<std::string>(allowed.begin(), allowed.end())));
    }
    return v;
  }

  std::string attribute(const std::string& key) {
    auto v = string(key);
    if (!identifier(v)) fail(key, "must name a config attribute (an identifier), got '" + v + "'");
    return v;
  }

  std::vector<std::string> strings(const std::string& key) {
    const auto* a = node(key).as_array();
    if (!a || a->empty()) fail(key, "must be a non-empty array of strings");
    std::vector<std::string> out;
    for (const auto& e : *a) {
      const auto* s = e.as_string();
      if (!s) fail(key, "must be a non-empty array of strings");
      out.push_back(s->get());
    }
    return out;
  }

  // "default" or "config.<attribute>".
  ConfiguredValue configured(const std::string& key, const std::string& default_word) {
    const auto v = string(key);
    if (v == default_word) return {};
    const std::string prefix = "config.";
    if (v.rfind(prefix, 0) == 0 && identifier(v.substr(prefix.size())))
      return {v.substr(prefix.size())};
    fail(key, "must be '" + default_word + "' or 'config.<attribute>', got '" + v + "'");
  }

  Table table(const std::string& key) {
    const auto* t = node(key).as_table();
    if (!t) fail(key, "must be a table ([" + prefix_ + key + "])");
    return Table(*t, file_, prefix_ + key + ".");
  }

  // Every key was read: a misspelt or unknown one is refused rather than ignored.
  void done() const {
    for (const auto& [k, v] : t_) {
      const std::string key(k.str());
      if (!read_.count(key)) {
        throw InputError(file_ + ":" + std::to_string(v.source().begin.line) + ": unknown key " +
                         prefix_ + key);
      }
    }
  }

 private:
  const toml::table& t_;
  std::string file_, prefix_;
  std::set<std::string> read_;
};

std::string stem(const std::string& path) {
  const auto slash = path.find_last_of('/');
  auto name = path.substr(slash == std::string::npos ? 0 : slash + 1);
  return name.substr(0, name.size() - 5);  // ".toml"
}

std::vector<ModelFamily> read_folder(const std::string& dir) {
  if (!files::is_directory(dir)) {
    throw InputError(dir +
                     ": no model-family folder (GRADSCOPE_FAMILIES_DIR or the source "
                     "tree's families/)");
  }
  std::vector<ModelFamily> out;
  std::map<std::string, std::string> type_owner;
  for (const auto& path : files::find_files(dir, ".toml", files::Walk::kTopLevel)) {
    out.push_back(read_model_family(path));
    for (const auto& t : out.back().model_types) {
      const auto [it, fresh] = type_owner.emplace(t, path);
      if (!fresh) {
        throw InputError(path + ": model_type '" + t + "' is declared by " + it->second +
                         " too (one family per model_type)");
      }
    }
  }
  return out;
}

}  // namespace

ModelFamily read_model_family(const std::string& path) {
  const toml::table parsed = read_toml_file(path, "model-family declaration");
  ModelFamily f;
  f.file = path;
  f.name = stem(path);
  if (!identifier(f.name)) {
    throw InputError(path + ": a family's name (its file name) must be an identifier");
  }
  Table top(parsed, path, "");
  f.description = top.string("description");
  f.model_types = top.strings("model_types");
  for (const auto& t : f.model_types) {
    if (!identifier(t))
      top.fail("model_types", "must hold config.model_type names, got '" + t + "'");
  }
  {
    auto t = top.table("norms");
    f.norms.kind = t.one_of("kind", kNormKinds);
    f.norms.eps = t.attribute("eps");
    t.done();
  }
  {
    auto t = top.table("rope");
    f.rope.types = t.strings("types");
    for (const auto& type : f.rope.types) {
      if (!kRopeTypes.count(type)) {
        t.fail("types", "holds '" + type + "'; gradscope models the rope_types " +
                            joined(std::vector<std::string>(kRopeTypes.begin(), kRopeTypes.end())));
      }
    }
    f.rope.theta = t.attribute("theta");
    t.done();
  }
  {
    auto t = top.table("attention");
    f.attention.heads = t.attribute("heads");
    f.attention.kv_heads = t.attribute("kv_heads");
    f.attention.mask = t.one_of("mask", kMasks);
    f.attention.scaling = t.configured("scaling", "default");
    f.attention.sliding_window = t.configured("sliding_window", "none");
    t.done();
  }
  {
    auto t = top.table("mlp");
    f.mlp.activation = t.one_of("activation", kActivations);
    t.done();
  }
  {
    auto t = top.table("residual");
    f.residual.multiplier = t.configured("multiplier", "default");
    t.done();
  }
  {
    auto t = top.table("projections");
    f.self_attn = t.strings("self_attn");
    f.mlp_projections = t.strings("mlp");
    if (f.self_attn != kSelfAttn) {
      t.fail("self_attn", "is [" + joined(f.self_attn) + "]; gradscope models separate " +
                              joined(kSelfAttn) + " in that order");
    }
    if (f.mlp_projections != kMlp) {
      t.fail("mlp", "is [" + joined(f.mlp_projections) + "]; gradscope models separate " +
                        joined(kMlp) + " in that order");
    }
    t.done();
  }
  top.done();
  return f;
}

std::string families_dir() {
  const char* env = std::getenv("GRADSCOPE_FAMILIES_DIR");
  return env && *env ? env : GRADSCOPE_DEFAULT_FAMILIES_DIR;
}

// The folder and each declaration's name, size and modification time: a declaration added or
// edited while a program runs (a walk-through, a notebook) is read again, not served stale.
std::string folder_state(const std::string& dir) {
  std::string state = dir;
  if (!files::is_directory(dir)) return state;
  for (const auto& path : files::find_files(dir, ".toml", files::Walk::kTopLevel)) {
    struct stat st {};
    if (stat(path.c_str(), &st) != 0) continue;
    state += "\n" + path + " " + std::to_string(st.st_size) + " " +
             std::to_string(st.st_mtim.tv_sec) + "." + std::to_string(st.st_mtim.tv_nsec);
  }
  return state;
}

const std::vector<ModelFamily>& model_families() {
  static std::mutex mutex;
  // Kept for the program's life: callers hold references into them.
  static std::map<std::string, std::unique_ptr<const std::vector<ModelFamily>>> read;
  const std::lock_guard lock(mutex);
  const auto dir = families_dir();
  auto& slot = read[folder_state(dir)];
  if (!slot) slot = std::make_unique<const std::vector<ModelFamily>>(read_folder(dir));
  return *slot;
}

const ModelFamily& model_family(const std::string& name) {
  std::vector<std::string> known;
  for (const auto& f : model_families()) {
    if (f.name == name) return f;
    known.push_back(f.name);
  }
  throw InputError("no model family '" + name + "' in " + families_dir() +
                   " (declared: " + (known.empty() ? "none" : joined(known)) + ")");
}

}  // namespace gradscope

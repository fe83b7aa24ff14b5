#include "reports/hdf5_dump.h"

#include <hdf5.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <functional>
#include <new>
#include <sstream>
#include <type_traits>
#include <variant>

#include "reports/output_file.h"

namespace gradscope::report {
namespace {

// Owns one HDF5 identifier.
class Handle {
 public:
  Handle(hid_t id, herr_t (*close)(hid_t)) : id_(id), close_(close) {}
  ~Handle() {
    if (id_ >= 0) close_(id_);
  }
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  hid_t get() const { return id_; }
  bool ok() const { return id_ >= 0; }

 private:
  hid_t id_;
  herr_t (*close_)(hid_t);
};

// HDF5 prints its own error stack to stderr by default; errors here become exceptions.
// Before libhdf5's first use. Its exit handler would close every file still in its ID
// table, and a file whose close failed (a full disk) stays there: libhdf5 1.10 then crashes
// at exit. gradscope closes what it opens itself, so the handler is not installed.
struct QuietErrors {
  QuietErrors() {
    H5dont_atexit();
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  }
};

void check(herr_t status, const std::string& what) {
  if (status < 0) throw DumpError(what);
}

class Writer {
 public:
  // Builds the file in memory (HDF5's core driver) and writes it to `file` (a staged
  // temporary) in one pass at close(). Errors name `path`, the file the user asked for.
  Writer(const std::string& file, const std::string& path) : path_(path) {
    static const QuietErrors quiet;
    // The 1.8+ file format checksums every metadata block (superblock v2+, object
    // headers v2): the reader can then refuse a corrupted dump instead of walking it.
    const Handle fapl(H5Pcreate(H5P_FILE_ACCESS), H5Pclose);
    H5Pset_libver_bounds(fapl.get(), H5F_LIBVER_V18, H5F_LIBVER_LATEST);
    H5Pset_fapl_core(fapl.get(), size_t{1} << 20, /*backing_store=*/true);
    // Version 2 object headers store timestamps unless told not to, the root's too.
    const Handle fcpl(H5Pcreate(H5P_FILE_CREATE), H5Pclose);
    H5Pset_obj_track_times(fcpl.get(), false);
    file_ = H5Fcreate(file.c_str(), H5F_ACC_TRUNC, fcpl.get(), fapl.get());
    if (file_ < 0) throw DumpError("cannot create " + path + " (disk full or file too large?)");
    gcpl_ = H5Pcreate(H5P_GROUP_CREATE);
    H5Pset_obj_track_times(gcpl_, false);
  }
  ~Writer() {
    H5Pclose(gcpl_);
    if (file_ >= 0) H5Fclose(file_);
  }
  // Writes the file out and closes it; a failure (a full disk) names the file. The handle is
  // given up first: HDF5 must not be asked to close it twice.
  void close() {
    const hid_t file = file_;
    file_ = -1;
    check(H5Fclose(file), "cannot write " + path_ + " (disk full or file too large?)");
  }

  // Creates every missing group along `path` (each without timestamps).
  hid_t group(const std::string& path) {
    std::string current;
    std::stringstream parts(path);
    for (std::string part; std::getline(parts, part, '/');) {
      if (part.empty()) continue;
      current += "/" + part;
      if (H5Lexists(file_, current.c_str(), H5P_DEFAULT) <= 0) {
        const hid_t g = H5Gcreate2(file_, current.c_str(), H5P_DEFAULT, gcpl_, H5P_DEFAULT);
        if (g < 0) throw DumpError("cannot create group " + current + " in " + path_);
        H5Gclose(g);
      }
    }
    return file_;
  }

  void attribute(const std::string& object, const std::string& name, const std::string& value) {
    const Handle type(H5Tcopy(H5T_C_S1), H5Tclose);
    H5Tset_size(type.get(), std::max<size_t>(1, value.size()));
    H5Tset_strpad(type.get(), H5T_STR_NULLPAD);
    write_attribute(object, name, type.get(), value.data());
  }
  void attribute(const std::string& object, const std::string& name, double value) {
    write_attribute(object, name, H5T_NATIVE_DOUBLE, &value);
  }
  void attribute(const std::string& object, const std::string& name, int64_t value) {
    write_attribute(object, name, H5T_NATIVE_INT64, &value);
  }

  void dataset(const std::string& group_path, const std::string& name, const TensorData& t) {
    group(group_path);
    std::vector<hsize_t> dims(t.shape.begin(), t.shape.end());
    if (dims.empty()) dims.push_back(t.values.size());
    const Handle space(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr),
                       H5Sclose);
    const Handle dcpl(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
    H5Pset_obj_track_times(dcpl.get(), false);
    if (t.values.size() >= 4096) {
      // Chunks of whole rows, at most ~1M elements; shuffle + deflate.
      std::vector<hsize_t> chunk = dims;
      hsize_t elements = 1;
      for (size_t i = 1; i < chunk.size(); ++i) elements *= chunk[i];
      chunk[0] = std::max<hsize_t>(
          1, std::min<hsize_t>(dims[0], (1 << 20) / std::max<hsize_t>(1, elements)));
      H5Pset_chunk(dcpl.get(), static_cast<int>(chunk.size()), chunk.data());
      H5Pset_shuffle(dcpl.get());
      H5Pset_deflate(dcpl.get(), 4);
    }
    // fp16 and bf16 (which HDF5 1.10 lacks) are stored as float32; fp64 stays fp64.
    const hid_t file_type = t.dtype == "fp64"    ? H5T_IEEE_F64LE
                            : t.dtype == "int32" ? H5T_STD_I32LE
                            : t.dtype == "int64" ? H5T_STD_I64LE
                            : t.dtype == "bool"  ? H5T_STD_U8LE
                                                 : H5T_IEEE_F32LE;
    const std::string full = group_path + "/" + name;
    const Handle ds(H5Dcreate2(file_, full.c_str(), file_type, space.get(), H5P_DEFAULT, dcpl.get(),
                               H5P_DEFAULT),
                    H5Dclose);
    if (!ds.ok()) throw DumpError("cannot create dataset " + full + " in " + path_);
    check(H5Dwrite(ds.get(), H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, t.values.data()),
          "cannot write dataset " + full + " in " + path_);
    attribute(full, "dtype", t.dtype);
  }

 private:
  void write_attribute(const std::string& object, const std::string& name, hid_t type,
                       const void* value) {
    const Handle space(H5Screate(H5S_SCALAR), H5Sclose);
    const Handle attr(H5Acreate_by_name(file_, object.c_str(), name.c_str(), type, space.get(),
                                        H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT),
                      H5Aclose);
    if (!attr.ok())
      throw DumpError("cannot write attribute " + object + "@" + name + " in " + path_);
    check(H5Awrite(attr.get(), type, value), "cannot write attribute " + name);
  }

  std::string path_;
  hid_t file_ = -1;
  hid_t gcpl_ = -1;
};

bool keep_check(const Check& c, const DumpOptions& o) {
  if (!c.tensors) return false;
  return !o.gradients_only ||
         (c.path.size() > 5 && c.path.compare(c.path.size() - 5, 5, ".grad") == 0);
}

void write_case(Writer& w, const CaseResult& c, const DumpOptions& o) {
  const std::string root = "/" + c.id;
  w.group(root);
  w.attribute(root, "kind", c.kind);
  w.attribute(root, "status", std::string(c.status()));
  w.attribute(root, "case_toml", c.spec_toml);
  for (const auto& field : c.spec) {
    const std::string& name = field.first;
    if (name == "seed" || name == "dtype" || name == "device") {
      std::visit(
          [&](const auto& v) {
            using T = std::decay_t<decltype(v)>;
            if constexpr (std::is_same_v<T, int64_t> || std::is_same_v<T, std::string>) {
              w.attribute(root, name, v);
            }
          },
          field.second);
    }
  }
  if (!o.gradients_only) {
    for (const auto& [name, data] : c.inputs) w.dataset(root + "/inputs", name, data);
  }
  if (c.loss_curve && !o.gradients_only) {
    const auto& lc = *c.loss_curve;
    const std::pair<const char*, const std::vector<double>*> curves[] = {
        {"prod", &lc.prod},
        {"base", &lc.base},
        {"ref", &lc.ref},
        {"grad_norm_prod", &lc.grad_norm_prod},
        {"grad_norm_base", &lc.grad_norm_base},
        {"grad_norm_ref", &lc.grad_norm_ref}};
    for (const auto& [name, values] : curves) {
      w.dataset(root + "/loss_curve", name,
                TensorData{"fp64", {static_cast<int64_t>(values->size())}, *values});
    }
    w.attribute(root + "/loss_curve", "divergence_step", lc.divergence_step.value_or(-1));
  }
  for (const auto& check : c.checks) {
    if (!keep_check(check, o)) continue;
    const std::string group = "/" + check.path;
    w.dataset(group, "prod", check.tensors->prod);
    if (check.tensors->base) w.dataset(group, "base", *check.tensors->base);
    w.dataset(group, "ref", check.tensors->ref);
    if (check.tensors->floor) w.dataset(group, "floor", *check.tensors->floor);
    w.attribute(group, "status", std::string(check.status()));
    w.attribute(group, "exact", static_cast<int64_t>(check.exact));
    w.attribute(group, "max_abs", check.max_abs);
    w.attribute(group, "mean_abs", check.mean_abs);
    w.attribute(group, "limit", check.limit);
    if (check.floor) w.attribute(group, "floor", *check.floor);
    w.attribute(group, "mismatches", check.mismatches);
    if (check.baseline_max_abs) w.attribute(group, "baseline_max_abs", *check.baseline_max_abs);
    if (check.baseline_mean_abs) w.attribute(group, "baseline_mean_abs", *check.baseline_mean_abs);
    if (check.baseline_mean_abs || !check.statistic_name.empty()) {
      w.attribute(group, "statistic", check.statistic());
    }
    if (check.rel_fro) w.attribute(group, "rel_fro", *check.rel_fro);
    if (check.cosine) w.attribute(group, "cosine", *check.cosine);
  }
}

// ---- reading ----

std::string read_attribute(hid_t attr) {
  const Handle type(H5Aget_type(attr), H5Tclose);
  // One value per attribute: an array attribute (not ours) would overflow the buffers below.
  const Handle space(H5Aget_space(attr), H5Sclose);
  if (!space.ok() || H5Sget_simple_extent_npoints(space.get()) != 1) return "";
  if (H5Tget_class(type.get()) == H5T_STRING) {
    if (H5Tis_variable_str(type.get()) > 0) {
      // h5py writes str attributes as variable-length strings: libhdf5 allocates the value.
      const Handle memtype(H5Tcopy(H5T_C_S1), H5Tclose);
      H5Tset_size(memtype.get(), H5T_VARIABLE);
      H5Tset_cset(memtype.get(), H5Tget_cset(type.get()));
      char* value = nullptr;
      if (H5Aread(attr, memtype.get(), &value) < 0 || value == nullptr) return "";
      std::string out(value, strnlen(value, 1u << 20));
      H5free_memory(value);
      return out;
    }
    if (H5Tget_size(type.get()) > (1u << 20)) return "";
    std::string value(H5Tget_size(type.get()), '\0');
    if (H5Aread(attr, type.get(), value.data()) < 0) return "";
    return value.substr(0, value.find('\0'));
  }
  if (H5Tget_class(type.get()) == H5T_INTEGER) {
    int64_t v = 0;
    H5Aread(attr, H5T_NATIVE_INT64, &v);
    return std::to_string(v);
  }
  double v = 0;
  H5Aread(attr, H5T_NATIVE_DOUBLE, &v);
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

std::map<std::string, std::string> read_attributes(hid_t object) {
  std::map<std::string, std::string> out;
  H5O_info_t info;
  if (H5Oget_info2(object, &info, H5O_INFO_NUM_ATTRS) < 0) return out;
  for (hsize_t i = 0; i < info.num_attrs; ++i) {
    const Handle attr(
        H5Aopen_by_idx(object, ".", H5_INDEX_NAME, H5_ITER_INC, i, H5P_DEFAULT, H5P_DEFAULT),
        H5Aclose);
    if (!attr.ok()) continue;
    const ssize_t n = H5Aget_name(attr.get(), 0, nullptr);
    if (n < 0 || n > 4096) continue;
    std::string name(n, '\0');
    H5Aget_name(attr.get(), n + 1, name.data());
    out[name] = read_attribute(attr.get());
  }
  return out;
}

// Half of what this process may hold: physical memory, or the address-space limit
// (`ulimit -v`) where one is set and lower.
size_t decoded_bytes_cap() {
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
  size_t memory = pages > 0 && page > 0 ? static_cast<size_t>(pages) * static_cast<size_t>(page)
                                        : size_t{16} << 30;
  struct rlimit limit {};
  if (::getrlimit(RLIMIT_AS, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY) {
    memory = std::min<size_t>(memory, limit.rlim_cur);
  }
  return memory / 2;
}

// The walk of a dump's groups, bounded on any file (docs/reports.md, "Limits of the reader").
// HDF5's own H5Ovisit skips an object it has seen only when the object's header counts more
// than one link, so a file whose group links back to its parent with a link count of 1 walks
// forever; and it opens every object by its full path from the root, which is quadratic in the
// nesting depth. This walk opens each child from its parent's handle, remembers every object
// by its address, and stops at the first limit crossed.
class DumpWalk {
 public:
  DumpWalk(Dump* dump, size_t file_bytes) : dump_(dump), file_bytes_(file_bytes) {}

  // Returns the first reason the file is refused, or "" when the walk completed.
  std::string walk(hid_t root) {
    try {
      H5O_info_t info;
      if (H5Oget_info2(root, &info, H5O_INFO_BASIC) < 0) return "cannot read the root group";
      seen_[info.addr] = "/";
      ancestors_.push_back({info.addr, "/"});
      group(root, "/", 0);
    } catch (const Refusal& r) {
      return r.what();
    }
    return "";
  }

 private:
  struct Refusal : std::runtime_error {
    using std::runtime_error::runtime_error;
  };
  struct Link {
    std::string name;
    H5L_type_t type;
  };
  struct Ancestor {
    haddr_t addr;
    std::string path;
  };

  static std::string child_path(const std::string& parent, const std::string& name) {
    return (parent == "/" ? "" : parent) + "/" + name;
  }

  // The links of one group, in name order. Collected before any is opened, so no exception
  // crosses libhdf5's iteration callback.
  std::vector<Link> links_of(hid_t group, const std::string& path) {
    struct Collect {
      std::vector<Link>* links;
      size_t budget;
    };
    std::vector<Link> links;
    Collect collect{&links, kMaxDumpObjects - objects_};
    auto cb = [](hid_t, const char* name, const H5L_info_t* info, void* data) -> herr_t {
      auto* c = static_cast<Collect*>(data);
      if (c->links->size() >= c->budget) return 1;  // past the object limit: stop here
      c->links->push_back({name, info->type});
      return 0;
    };
    hsize_t index = 0;
    if (H5Literate(group, H5_INDEX_NAME, H5_ITER_INC, &index, cb, &collect) < 0) {
      throw Refusal("cannot list the links of group " + path + " (truncated or corrupt file?)");
    }
    if (links.size() >= collect.budget) {
      throw Refusal("more than " + std::to_string(kMaxDumpObjects) +
                    " objects (the reader's limit), reached in group " + path);
    }
    return links;
  }

  void group(hid_t g, const std::string& path, int depth) {
    dump_->group_attributes[path] = read_attributes(g);
    for (const auto& link : links_of(g, path)) {
      ++objects_;
      const std::string child = child_path(path, link.name);
      if (link.name.empty() || link.name == "." || link.name.find('/') != std::string::npos) {
        throw Refusal("group " + path + " holds a link named '" + link.name +
                      "', not a plain name (corrupt file?)");
      }
      if (link.type != H5L_TYPE_HARD) {
        throw Refusal(child + " is a " + (link.type == H5L_TYPE_SOFT ? "soft" : "external") +
                      " link; a gradscope dump holds only hard links");
      }
      const Handle object(H5Oopen(g, link.name.c_str(), H5P_DEFAULT), H5Oclose);
      H5O_info_t info;
      if (!object.ok() || H5Oget_info2(object.get(), &info, H5O_INFO_BASIC) < 0) {
        throw Refusal("cannot open " + child + " (truncated or corrupt file?)");
      }
      const auto [first, fresh] = seen_.emplace(info.addr, child);
      if (!fresh) {
        for (const auto& a : ancestors_) {
          if (a.addr == info.addr) throw Refusal("group " + path + " links back to " + a.path);
        }
        throw Refusal(child + " is a second link to " + first->second +
                      "; a gradscope dump links each object once");
      }
      if (info.type == H5O_TYPE_GROUP) {
        if (depth + 1 > kMaxDumpDepth) {
          throw Refusal("groups nested deeper than " + std::to_string(kMaxDumpDepth) +
                        " levels (the reader's limit) at " + child);
        }
        ancestors_.push_back({info.addr, child});
        group(object.get(), child, depth + 1);
        ancestors_.pop_back();
      } else if (info.type == H5O_TYPE_DATASET) {
        dataset(object.get(), child);
      } else {
        throw Refusal(child + " is a named datatype; a gradscope dump holds only groups and " +
                      "datasets");
      }
    }
  }

  void dataset(hid_t ds, const std::string& path) {
    const Handle type(H5Dget_type(ds), H5Tclose);
    const H5T_class_t cls = type.ok() ? H5Tget_class(type.get()) : H5T_NO_CLASS;
    if (cls != H5T_INTEGER && cls != H5T_FLOAT) {
      throw Refusal(
          "dataset " + path + " holds " +
          (cls == H5T_STRING ? std::string("strings") : std::string("non-numeric values")) +
          "; a gradscope dump's datasets hold numbers");
    }
    const Handle space(H5Dget_space(ds), H5Sclose);
    const int rank = space.ok() ? H5Sget_simple_extent_ndims(space.get()) : -1;
    if (rank < 0 || rank > 8) {
      throw Refusal("dataset " + path + " has rank " + std::to_string(rank) + " (corrupt file?)");
    }
    std::vector<hsize_t> dims(rank);
    H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr);
    DumpDataset d;
    d.path = path;
    // A corrupt extent must not become a huge allocation: deflate stores at most ~1032
    // bytes per byte of file, so no dump dataset holds more elements than that.
    const size_t max_elements = 1032 * std::max<size_t>(file_bytes_, 1);
    size_t count = 1;
    for (auto v : dims) {
      d.shape.push_back(static_cast<int64_t>(v));
      if (v != 0 && count > max_elements / v) {
        throw Refusal("dataset " + path + " claims more elements than a file of " +
                      std::to_string(file_bytes_) + " bytes can hold (corrupt file?)");
      }
      count *= v;
    }
    // A small compressed dataset can still decode to more than the machine holds: the reader
    // keeps every value as fp64, and refuses (before allocating) a dump whose decoded values
    // exceed half of physical memory.
    decoded_bytes_ += count * sizeof(double);
    if (decoded_bytes_ > decoded_bytes_cap()) {
      throw Refusal("the datasets up to " + path + " decode to " +
                    std::to_string(decoded_bytes_ >> 20) + " MiB, more than half of the " +
                    "memory this process may use (" + std::to_string(decoded_bytes_cap() >> 20) +
                    " MiB)");
    }
    try {
      d.values.resize(count);
    } catch (const std::bad_alloc&) {
      throw Refusal("dataset " + path + " decodes to " + std::to_string((count * 8) >> 20) +
                    " MiB of values: out of memory");
    }
    if (count > 0 &&
        H5Dread(ds, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, d.values.data()) < 0) {
      throw Refusal("cannot read dataset " + path + " (" + std::to_string(count) +
                    " values; truncated or corrupt file, or out of memory while decoding it)");
    }
    const auto attrs = read_attributes(ds);
    auto it = attrs.find("dtype");
    d.dtype = it == attrs.end() ? "?" : it->second;
    dump_->datasets.push_back(std::move(d));
  }

  Dump* dump_;
  size_t file_bytes_;
  size_t decoded_bytes_ = 0;             // of every dataset read so far
  size_t objects_ = 0;                   // links followed so far
  std::map<haddr_t, std::string> seen_;  // object address -> the path it was first reached by
  std::vector<Ancestor> ancestors_;      // the groups from the root to the one being walked
};

}  // namespace

namespace {

// The whole file or nothing: `fill` builds the file in memory, whose bytes go to a staged
// temporary renamed over `path` (reports/output_file.h). A device or FIFO is refused: the
// output is a file to open later, not a stream.
template <typename Fill>
void write_atomically(const std::string& path, Fill&& fill) {
  if (output_target(path) != OutputTarget::kRegularFile) {
    throw DumpError("cannot write " + path +
                    ": an HDF5 file must be a regular file, not a device or pipe");
  }
  StagedFile staged(path);
  {
    Writer w(staged.temp_path(), path);
    fill(w);
    w.close();
  }
  staged.commit();
}

}  // namespace

struct DumpWriter::State {
  State(const std::string& path, const DumpOptions& options)
      : staged(path), writer(staged.temp_path(), path), options(options) {}
  StagedFile staged;
  Writer writer;
  DumpOptions options;
};

DumpWriter::DumpWriter(const std::string& path, const DumpOptions& options) {
  if (output_target(path) != OutputTarget::kRegularFile) {
    throw DumpError("cannot write " + path +
                    ": an HDF5 file must be a regular file, not a device or pipe");
  }
  state_ = std::make_unique<State>(path, options);
}

DumpWriter::~DumpWriter() = default;

void DumpWriter::add_case(const CaseResult& c) {
  if (!state_) throw DumpError("dump already finished");
  if (state_->options.failing_only && c.passed()) return;
  write_case(state_->writer, c, state_->options);
}

void DumpWriter::finish(const RunReport& report) {
  if (!state_) throw DumpError("dump already finished");
  auto& w = state_->writer;
  w.attribute("/", "format", std::string(kDumpFormat));
  w.attribute("/", "schema_version", static_cast<int64_t>(kDumpSchemaVersion));
  w.attribute("/", "gradscope_version", report.version);
  const auto& env = report.environment;
  w.attribute("/", "commit", env.commit);
  w.attribute("/", "device", env.device);
  w.attribute("/", "gpu", env.gpu.value_or(""));
  w.attribute("/", "torch", env.torch);
  w.attribute("/", "cuda", env.cuda.value_or(""));
  w.attribute("/", "compiler", env.compiler);
  w.attribute("/", "implementation", report.implementation.describe());
  w.close();
  state_->staged.commit();
  state_.reset();
}

void write_dump(const std::string& path, const RunReport& report, const DumpOptions& options) {
  DumpWriter dump(path, options);
  for (const auto& c : report.cases) dump.add_case(c);
  dump.finish(report);
}

void write_arrays(const std::string& path, const std::map<std::string, std::string>& attributes,
                  const std::vector<std::pair<std::string, TensorData>>& datasets) {
  write_atomically(path, [&](Writer& w) {
    for (const auto& [name, value] : attributes) w.attribute("/", name, value);
    for (const auto& [name, data] : datasets) w.dataset("/", name, data);
  });
}

Dump read_dump(const std::string& path) {
  static const QuietErrors quiet;
  if (::access(path.c_str(), R_OK) != 0) throw DumpError(path + ": file not found or unreadable");
  // Opening a FIFO would block until a writer appears; a folder is no dump either.
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) {
    throw DumpError(path + ": not a regular file (a dump is an HDF5 file)");
  }
  if (H5Fis_hdf5(path.c_str()) <= 0) throw DumpError(path + ": not an HDF5 file");
  // libhdf5 trusts unchecksummed (version 0/1) metadata and can crash on a corrupt file
  // (the dump-reader fuzzer found a SEGV): only the checksummed format gradscope writes
  // is read. The superblock version is the byte after the 8-byte signature.
  {
    unsigned char head[9] = {};
    FILE* f = std::fopen(path.c_str(), "rb");
    const size_t got = f ? std::fread(head, 1, sizeof head, f) : 0;
    if (f) std::fclose(f);
    if (got != sizeof head || std::memcmp(head, "\x89HDF\r\n\x1a\n", 8) != 0) {
      throw DumpError(path + ": not a gradscope dump (no HDF5 superblock at offset 0)");
    }
    if (head[8] < 2) {
      throw DumpError(path + ": not a gradscope dump (HDF5 superblock version " +
                      std::to_string(head[8]) +
                      "; gradscope writes version 2 or later, with checksummed metadata)");
    }
  }
  const Handle file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
  if (!file.ok()) throw DumpError(path + ": cannot open (truncated or corrupt HDF5 file?)");
  Dump dump;
  dump.attributes = read_attributes(file.get());
  auto format = dump.attributes.find("format");
  if (format == dump.attributes.end() || format->second != kDumpFormat) {
    throw DumpError(path + ": not a gradscope dump (root attribute format != \"" +
                    std::string(kDumpFormat) + "\")");
  }
  const auto version = dump.attributes.find("schema_version");
  const std::string expected_version = std::to_string(kDumpSchemaVersion);
  if (version == dump.attributes.end() || version->second != expected_version) {
    throw DumpError(
        path + ": dump schema_version " +
        (version == dump.attributes.end() ? std::string("missing") : "'" + version->second + "'") +
        "; this gradscope reads version " + expected_version + " (docs/reports.md)");
  }
  hsize_t file_bytes = 0;
  H5Fget_filesize(file.get(), &file_bytes);
  const std::string refused = DumpWalk(&dump, file_bytes).walk(file.get());
  if (!refused.empty()) throw DumpError(path + ": " + refused);
  for (const auto& [group, attrs] : dump.group_attributes) {
    if (std::count(group.begin(), group.end(), '/') == 1 && group != "/" && attrs.count("kind")) {
      dump.cases.push_back(group.substr(1));
    }
  }
  std::sort(dump.cases.begin(), dump.cases.end());
  std::sort(dump.datasets.begin(), dump.datasets.end(),
            [](const DumpDataset& a, const DumpDataset& b) { return a.path < b.path; });
  return dump;
}

}  // namespace gradscope::report

// gradscope._gradscope: the engine for the Python package (python/gradscope), as typed values:
// the kinds' declarations and the facts defined once in C++ (dtypes, a layer's projections,
// the operator contract), cases built from values or selected from case files, tensors handed
// over as DLPack capsules, runs in this process returning typed results, and the command line.
// Importing it also registers gradscope's own operators (torch.ops.gradscope.*): the harness's
// copy of the kernels carries the registration.
#include <ATen/DLConvertor.h>
#include <pybind11/native_enum.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cctype>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/dtype_table.h"
#include "gradscope/faults.h"
#include "gradscope/op_schemas.h"
#include "harness/catalog/case_file.h"
#include "harness/catalog/kind_registry.h"
#include "harness/cli/case_selection.h"
#include "harness/cli/cli.h"
#include "harness/cli/environment.h"
#include "harness/cli/run_command.h"
#include "harness/common/dtypes.h"
#include "harness/common/input_error.h"
#include "harness/common/llama_projections.h"
#include "harness/impl/impl_ops.h"
#include "harness/kinds/case_tensors.h"
#include "harness/spec/model_family.h"
#include "harness/verdict/end_to_end_rule.h"
#include "reports/hdf5_dump.h"
#include "reports/model_report.h"
#include "reports/output_file.h"

namespace py = pybind11;
using gradscope::report::SpecValue;

namespace {

// A Python value as a case value, without conversion: bool before int (a bool is an int in
// Python), a whole number only from int; the field's type is checked by the case engine.
SpecValue spec_value(const py::handle& v, const std::string& origin, const std::string& name) {
  if (py::isinstance<py::bool_>(v)) return v.cast<bool>();
  if (py::isinstance<py::int_>(v)) {
    try {
      return v.cast<int64_t>();
    } catch (const py::cast_error&) {
      throw gradscope::InputError(origin + ": key '" + name + "' is " +
                                  py::str(v).cast<std::string>() +
                                  ", past a 64-bit integer's range");
    }
  }
  if (py::isinstance<py::float_>(v)) return v.cast<double>();
  if (py::isinstance<py::str>(v)) return v.cast<std::string>();
  throw gradscope::InputError(origin + ": key '" + name + "' is a " +
                              py::str(py::type::of(v).attr("__name__")).cast<std::string>() +
                              "; a case takes an int, a float, a bool or a str");
}

py::object py_value(const SpecValue& v) {
  return std::visit([](const auto& x) -> py::object { return py::cast(x); }, v);
}

py::dict spec_dict(const gradscope::report::SpecFields& fields) {
  py::dict out;
  for (const auto& [name, value] : fields) out[py::str(name)] = py_value(value);
  return out;
}

// A tensor from a DLPack capsule (torch.utils.dlpack.to_dlpack), consumed as the protocol says.
at::Tensor from_capsule(py::capsule capsule, const std::string& what) {
  if (std::string(capsule.name() ? capsule.name() : "") != "dltensor") {
    throw gradscope::InputError(what + ": not an unused DLPack capsule");
  }
  auto* managed = capsule.get_pointer<DLManagedTensor>();
  capsule.set_name("used_dltensor");
  return at::fromDLPack(managed);
}

py::capsule to_capsule(const at::Tensor& t) {
  DLManagedTensor* managed = at::toDLPack(t);
  return py::capsule(managed, "dltensor", [](PyObject* o) {
    // Never consumed: the capsule still owns the tensor.
    if (PyCapsule_IsValid(o, "dltensor")) {
      auto* m = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(o, "dltensor"));
      if (m && m->deleter) m->deleter(m);
    }
  });
}

// A case as the package holds it: a spec with its id.
struct Case {
  gradscope::CaseSpec spec;
  std::string id;
};

std::vector<gradscope::SelectedCase> selected(const std::vector<Case>& cases) {
  std::vector<gradscope::SelectedCase> out;
  for (const auto& c : cases) out.push_back({c.spec, c.id, "", ""});
  return out;
}

// Ctrl-C under Python: its handler only sets a flag, which a run reads between phases and
// cases and stops on, leaving no report or dump behind; the caller raises the
// KeyboardInterrupt that PyErr_CheckSignals set.
void python_interrupt() {
  py::gil_scoped_acquire gil;
  if (PyErr_CheckSignals() != 0) throw gradscope::RunInterrupted{};
}

at::ScalarType dtype_named(const std::string& name) {
  return gradscope::scalar_type_of(gradscope::dtype_facts(name));
}

std::optional<double> optional_float(const py::handle& v) {
  return v.is_none() ? std::nullopt : std::optional<double>(v.cast<double>());
}

// check_model's report (gradscope.check_module.ModelReport, its ModuleResult, Case and Check
// records) as the report writers take it.
gradscope::report::ModelReport model_report(const py::handle& report) {
  gradscope::report::ModelReport out;
  out.note = report.attr("note").cast<std::string>();
  for (const auto& m : report.attr("modules")) {
    gradscope::report::ModelModule module;
    module.path = m.attr("path").cast<std::string>();
    module.kind = m.attr("kind").cast<std::string>();
    module.passed = m.attr("passed").cast<bool>();
    module.not_judged = py::len(m.attr("not_judged")) > 0;
    for (const auto& c : m.attr("cases")) {
      gradscope::report::ModelCase mc;
      mc.id = c.attr("id").cast<std::string>();
      mc.status = c.attr("status").cast<std::string>();
      mc.replay = c.attr("replay").cast<std::string>();
      const auto unsupported = c.attr("unsupported");
      mc.unsupported = unsupported.is_none() ? "" : unsupported.cast<std::string>();
      for (const auto& k : c.attr("checks")) {
        mc.checks.push_back(
            {k.attr("name").cast<std::string>(), k.attr("status").cast<std::string>(),
             k.attr("statistic").cast<std::string>(), optional_float(k.attr("max_abs")),
             optional_float(k.attr("limit")), k.attr("message").cast<std::string>()});
      }
      module.cases.push_back(std::move(mc));
    }
    out.modules.push_back(std::move(module));
  }
  return out;
}

struct RunArgs {
  std::string impl = "gradscope";
  std::vector<std::string> ops_libraries, imports;
  std::string json, dump, junit, html;
  bool console = false, quiet = false, allow_unsupported = false, fail_fast = false;
  std::string program = "python3 -m gradscope";
};

// The facts defined once in C++: operator schemas, dtypes, a layer's projections.
void bind_facts(py::module_& m) {
  namespace gs = gradscope;
  namespace rp = gradscope::report;
  // Facts defined once in C++.
  py::dict schemas;
  for (const auto& op : gs::kOpSchemas) schemas[op.name] = op.schema;
  m.attr("OP_SCHEMAS") = schemas;
  m.attr("OP_SCHEMA_VERSION") = gs::kOpSchemaVersion;
  m.attr("FAULT_SWITCHES") = gs::fault_switches_linked();

  py::class_<gs::DtypeFacts>(m, "DtypeFacts", "one row of gradscope's dtype table")
      .def_property_readonly("name", [](const gs::DtypeFacts& d) { return std::string(d.name); })
      .def_readonly("floating", &gs::DtypeFacts::floating)
      .def_readonly("unit_roundoff", &gs::DtypeFacts::unit_roundoff)
      .def_readonly("epsilon", &gs::DtypeFacts::epsilon)
      .def_readonly("max", &gs::DtypeFacts::max)
      .def_readonly("rtol", &gs::DtypeFacts::rtol)
      .def_readonly("atol", &gs::DtypeFacts::atol)
      .def_property_readonly(
          "aten", [](const gs::DtypeFacts& d) { return c10::toString(gs::scalar_type_of(d)); },
          "ATen's name of the type (Float, Half, BFloat16, Double, Int, Long)")
      .def("__repr__",
           [](const gs::DtypeFacts& d) { return "DtypeFacts(" + std::string(d.name) + ")"; });
  std::vector<const gs::DtypeFacts*> dtypes;
  for (const auto& d : gs::kDtypeTable) dtypes.push_back(&d);
  m.attr("DTYPES") = py::cast(dtypes, py::return_value_policy::reference);
  std::vector<std::pair<std::string, std::string>> projections;
  for (const auto& p : gs::kLlamaProjections) {
    projections.emplace_back(std::string(p.name), std::string(p.module));
  }
  m.attr("LAYER_PROJECTIONS") = projections;
}

// The kinds' declarations: their fields.
void bind_kinds(py::module_& m) {
  namespace gs = gradscope;
  namespace rp = gradscope::report;
  // The kinds' declarations.
  py::class_<gs::FieldSpec>(m, "Field", "a field of a kind (docs/case-files.md)")
      .def_readonly("name", &gs::FieldSpec::name)
      .def_property_readonly("type",
                             [](const gs::FieldSpec& f) {
                               return f.type == gs::FieldType::kInt     ? "int"
                                      : f.type == gs::FieldType::kFloat ? "float"
                                      : f.type == gs::FieldType::kBool  ? "bool"
                                                                        : "str";
                             })
      .def_property_readonly("default",
                             [](const gs::FieldSpec& f) { return py_value(f.default_value); })
      .def_readonly("doc", &gs::FieldSpec::doc)
      .def_property_readonly("choices",
                             [](const gs::FieldSpec& f) {
                               py::list out;
                               for (const auto& c : f.choices) out.append(py_value(c));
                               return out;
                             })
      .def_readonly("min", &gs::FieldSpec::min)
      .def_readonly("max", &gs::FieldSpec::max);
  py::class_<gs::CaseKind>(m, "Kind", "a case kind as declared (harness/kinds)")
      .def_property_readonly("name", &gs::CaseKind::name)
      .def_property_readonly(
          "fields", [](const gs::CaseKind& k) { return gs::schema_for_kind(k.name()); },
          "its fields, the common ones (kind, seed, dtype, device) first")
      .def_property_readonly("sampled", &gs::CaseKind::sampled);
  m.def(
      "kinds",
      [] {
        std::vector<const gs::CaseKind*> out;
        for (const auto& n : gs::kind_names()) out.push_back(gs::find_kind(n));
        return out;
      },
      py::return_value_policy::reference);
}

// The model families' declarations.
void bind_families(py::module_& m) {
  namespace gs = gradscope;
  namespace rp = gradscope::report;
  // The model families' declarations (docs/model-families.md). A configured value is the
  // config attribute's name, or None for the part's default.
  const auto configured = [](const gs::ConfiguredValue& v) -> std::optional<std::string> {
    return v.configured() ? std::optional<std::string>(v.config) : std::nullopt;
  };
  py::class_<gs::ModelFamily::Norms>(m, "FamilyNorms", "a family's norms")
      .def_readonly("kind", &gs::ModelFamily::Norms::kind)
      .def_readonly("eps", &gs::ModelFamily::Norms::eps, "the config attribute of epsilon");
  py::class_<gs::ModelFamily::Rope>(m, "FamilyRope", "a family's rotary embedding")
      .def_readonly("types", &gs::ModelFamily::Rope::types, "the rope_type values it reads")
      .def_readonly("theta", &gs::ModelFamily::Rope::theta, "the rope parameters' key of the base");
  py::class_<gs::ModelFamily::Attention>(m, "FamilyAttention", "a family's attention")
      .def_readonly("heads", &gs::ModelFamily::Attention::heads)
      .def_readonly("kv_heads", &gs::ModelFamily::Attention::kv_heads)
      .def_readonly("mask", &gs::ModelFamily::Attention::mask)
      .def_property_readonly(
          "scaling",
          [configured](const gs::ModelFamily::Attention& a) { return configured(a.scaling); })
      .def_property_readonly("sliding_window", [configured](const gs::ModelFamily::Attention& a) {
        return configured(a.sliding_window);
      });
  py::class_<gs::ModelFamily>(m, "ModelFamily", "a model family's decoder layer, as declared")
      .def_readonly("name", &gs::ModelFamily::name)
      .def_readonly("file", &gs::ModelFamily::file)
      .def_readonly("description", &gs::ModelFamily::description)
      .def_readonly("model_types", &gs::ModelFamily::model_types)
      .def_readonly("norms", &gs::ModelFamily::norms)
      .def_readonly("rope", &gs::ModelFamily::rope)
      .def_readonly("attention", &gs::ModelFamily::attention)
      .def_property_readonly("activation",
                             [](const gs::ModelFamily& f) { return f.mlp.activation; })
      .def_property_readonly(
          "residual_multiplier",
          [configured](const gs::ModelFamily& f) { return configured(f.residual.multiplier); })
      .def_readonly("self_attn", &gs::ModelFamily::self_attn)
      .def_readonly("mlp", &gs::ModelFamily::mlp_projections)
      .def("__repr__", [](const gs::ModelFamily& f) { return "ModelFamily(" + f.name + ")"; });
  m.def(
      "families", [] { return gs::model_families(); }, py::return_value_policy::reference,
      "the declarations in families_dir(); GradscopeInputError for a malformed one");
  m.def("families_dir", &gs::families_dir);
}

// Results: the enums, checks and case results.
void bind_results(py::module_& m) {
  namespace gs = gradscope;
  namespace rp = gradscope::report;
  // Results.
  // The enums' member names are the reports' words (report_types.cpp), upper case.
  static std::deque<std::string> names;  // never moved: the members keep pointers into them
  const auto upper = [](const char* word) -> const char* {
    std::string name(word);
    for (auto& ch : name) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
    names.push_back(name);
    return names.back().c_str();
  };
  py::native_enum<rp::CheckStatus> check_status(m, "CheckStatus", "enum.Enum",
                                                "a check's verdict; OUT_OF_RANGE: not judged");
  for (auto v : {rp::CheckStatus::kPass, rp::CheckStatus::kFail, rp::CheckStatus::kOutOfRange}) {
    check_status.value(upper(rp::status_name(v)), v);
  }
  check_status.finalize();
  py::native_enum<rp::Outcome> outcome(m, "Outcome", "enum.Enum", "a case's outcome");
  for (auto v :
       {rp::Outcome::kPass, rp::Outcome::kFail, rp::Outcome::kInvalid, rp::Outcome::kUnsupported}) {
    outcome.value(upper(rp::outcome_name(v)), v);
  }
  outcome.finalize();
  py::class_<rp::Check>(m, "Check", "one compared tensor of a case and its verdict")
      .def_readonly("path", &rp::Check::path)
      .def_property_readonly("status", &rp::Check::status_code)
      .def_readonly("exact", &rp::Check::exact)
      .def_property_readonly("statistic", &rp::Check::statistic,
                             "what the rule compares with the limit: exact, max_abs, mean_abs, "
                             "frobenius or abs")
      .def_property_readonly("gated_error", &rp::Check::gated_error, "the value of that statistic")
      .def_readonly("numel", &rp::Check::numel)
      .def_readonly("mismatches", &rp::Check::mismatches)
      .def_readonly("max_abs", &rp::Check::max_abs)
      .def_readonly("mean_abs", &rp::Check::mean_abs)
      .def_readonly("baseline_max_abs", &rp::Check::baseline_max_abs)
      .def_readonly("limit", &rp::Check::limit)
      .def_readonly("floor", &rp::Check::floor)
      .def_readonly("error_to_limit", &rp::Check::error_to_limit)
      .def_readonly("note", &rp::Check::note)
      .def_property_readonly("message", [](const rp::Check& c) { return c.failure; });
  py::class_<rp::CaseResult>(m, "CaseResult", "one case run: its checks and outcome")
      .def_readonly("id", &rp::CaseResult::id)
      .def_readonly("kind", &rp::CaseResult::kind)
      .def_property_readonly("outcome", &rp::CaseResult::outcome)
      .def_readonly("checks", &rp::CaseResult::checks)
      .def_readonly("replay", &rp::CaseResult::replay)
      .def_readonly("input_error", &rp::CaseResult::input_error)
      .def_readonly("unsupported", &rp::CaseResult::unsupported)
      .def_readonly("seconds", &rp::CaseResult::seconds)
      .def_property_readonly("spec", [](const rp::CaseResult& c) { return spec_dict(c.spec); })
      .def_property_readonly("metrics", [](const rp::CaseResult& c) {
        py::dict out;
        for (const auto& [k, v] : c.metrics) out[py::str(k)] = v;
        return out;
      });
}

// Cases built from values or selected from files, and runs of them.
void bind_cases(py::module_& m) {
  namespace gs = gradscope;
  namespace rp = gradscope::report;
  // Cases, built from values or selected from files.
  py::class_<Case>(m, "Case", "a case to run: its kind's fields and its id")
      .def_readonly("id", &Case::id)
      .def_property_readonly("kind", [](const Case& c) { return c.spec.kind; })
      .def_property_readonly("fields", [](const Case& c) { return spec_dict(c.spec.fields()); })
      .def_property_readonly(
          "inputs", [](const Case& c) { return gs::find_kind(c.spec.kind)->inputs(c.spec); },
          "the names the case takes its activation and output gradients by")
      .def_property_readonly(
          "gradients",
          [](const Case& c) {
            std::vector<std::pair<std::string, std::string>> out;
            for (const auto& g : gs::find_kind(c.spec.kind)->gradients(c.spec)) {
              out.emplace_back(g.name, g.output);
            }
            return out;
          },
          "(name, output): each output gradient the case takes and the output it is of")
      .def_property_readonly(
          "parts",
          [](const Case& c) {
            std::vector<std::tuple<std::string, std::string, int64_t>> out;
            for (const auto& p : gs::find_kind(c.spec.kind)->parts(c.spec)) {
              out.emplace_back(p.path, p.stream, p.layer);
            }
            return out;
          },
          "(path, stream, layer): the projections and norms whose tensors the case may be "
          "handed, where each sits in the module, its tensors' stream and its layer (stacks)")
      .def(
          "with_tensors",
          [](const Case& c, const py::dict& tensors, const std::string& source) {
            auto given = std::make_shared<gs::GivenTensors>();
            given->source = source;
            for (const auto& [name, capsule] : tensors) {
              const auto key = py::str(name).cast<std::string>();
              given->tensors.emplace_back(
                  key, from_capsule(capsule.cast<py::capsule>(), source + ": " + key));
            }
            Case out = c;
            out.spec.given_tensors = std::move(given);
            gs::find_kind(out.spec.kind)->validate(out.spec);
            out.id = gs::find_kind(out.spec.kind)->case_id(out.spec);
            return out;
          },
          py::arg("tensors"), py::arg("source"),
          "the case with these tensors (name: a DLPack capsule) in place of its draws of the "
          "same names; `source` names them in errors");
  m.def(
      "build_cases",
      [](const std::string& kind, const py::dict& fields, const py::dict& matrix,
         const std::string& origin) {
        gs::FieldValues values;
        for (const auto& [k, v] : fields) {
          const auto name = py::str(k).cast<std::string>();
          values.emplace_back(name, spec_value(v, origin, name));
        }
        gs::MatrixValues axes;
        for (const auto& [k, v] : matrix) {
          const auto name = py::str(k).cast<std::string>();
          std::vector<SpecValue> list;
          for (const auto& item : v.cast<py::sequence>()) {
            list.push_back(spec_value(item, origin, name));
          }
          axes.emplace_back(name, std::move(list));
        }
        std::vector<Case> out;
        for (auto& sc :
             gs::selected_from_specs(gs::cases_from_values(kind, values, axes, origin))) {
          out.push_back({std::move(sc.spec), std::move(sc.id)});
        }
        return out;
      },
      py::arg("kind"), py::arg("fields"), py::arg("matrix") = py::dict(), py::arg("origin"),
      "cases of `kind` from typed field values (and a matrix of them); GradscopeInputError "
      "names `origin` and the field");
  m.def(
      "select_cases",
      [](const std::vector<std::string>& files, const std::string& suite,
         const std::vector<std::string>& filters, const std::string& device,
         const std::string& dtype, int64_t seed) {
        gs::CaseSelection sel;
        sel.files = files;
        sel.suite = suite;
        sel.filters = filters;
        sel.device = device;
        sel.dtype = dtype;
        sel.seed = seed;
        std::vector<Case> out;
        for (auto& sc : gs::select_cases(sel))
          out.push_back({std::move(sc.spec), std::move(sc.id)});
        return out;
      },
      py::arg("files"), py::arg("suite") = "", py::arg("filters") = std::vector<std::string>{},
      py::arg("device") = "", py::arg("dtype") = "", py::arg("seed") = -1,
      "the command line's selection: case files, or a suite (smoke without either), the "
      "overrides, the id globs");

  py::class_<RunArgs>(m, "RunArgs", "the implementation under test and the reports of a run")
      .def(py::init<>())
      .def_readwrite("impl", &RunArgs::impl)
      .def_readwrite("ops_libraries", &RunArgs::ops_libraries)
      .def_readwrite("imports", &RunArgs::imports)
      .def_readwrite("json", &RunArgs::json)
      .def_readwrite("dump", &RunArgs::dump)
      .def_readwrite("junit", &RunArgs::junit)
      .def_readwrite("html", &RunArgs::html)
      .def_readwrite("console", &RunArgs::console)
      .def_readwrite("quiet", &RunArgs::quiet)
      .def_readwrite("allow_unsupported", &RunArgs::allow_unsupported)
      .def_readwrite("fail_fast", &RunArgs::fail_fast)
      .def_readwrite("program", &RunArgs::program);
  py::class_<gs::RunVerdict>(m, "RunVerdict", "the run's exit code and why, where a reason did")
      .def_readonly("exit_code", &gs::RunVerdict::exit_code)
      .def_readonly("message", &gs::RunVerdict::message);
  m.def(
      "run",
      [](const std::vector<Case>& cases, const RunArgs& a) {
        gs::ReportOptions o;
        o.impl.ns = a.impl;
        o.impl.libraries = a.ops_libraries;
        o.impl.imports = a.imports;
        o.json = a.json;
        o.dump = a.dump;
        o.junit = a.junit;
        o.html = a.html;
        o.console = a.console;
        o.quiet = a.quiet;
        o.allow_unsupported = a.allow_unsupported;
        o.fail_fast = a.fail_fast;
        o.poll = python_interrupt;
        auto list = selected(cases);
        std::optional<rp::RunReport> report;
        try {
          py::gil_scoped_release release;  // Python operators take it when called
          report = gs::run_cases(std::move(list), o, a.program);
        } catch (const gs::RunInterrupted&) {
          throw py::error_already_set();  // the KeyboardInterrupt PyErr_CheckSignals raised
        }
        auto verdict = gs::run_verdict(*report, o);
        return std::make_pair(std::move(report->cases), verdict);
      },
      py::arg("cases"), py::arg("args"),
      "runs the cases in this process; returns each case's result and the run's verdict");
  m.def(
      "generate",
      [](const Case& c) {
        gs::RunOptions options;
        py::dict out;
        std::vector<std::pair<std::string, at::Tensor>> tensors;
        {
          py::gil_scoped_release release;
          tensors = gs::find_kind(c.spec.kind)->generate(c.spec, c.id, options);
        }
        for (const auto& [name, t] : tensors) out[py::str(name)] = to_capsule(t);
        return out;
      },
      py::arg("case"),
      "the case's generated tensors (DLPack capsules) under the names its tensors take");
}

// The end-to-end rule, its dump and the model command's reports.
void bind_end_to_end(py::module_& m) {
  namespace gs = gradscope;
  namespace rp = gradscope::report;
  // The end-to-end rule (harness/verdict/end_to_end_rule.h) and the dump of its case.
  py::register_exception<gs::EndToEndNotJudged>(m, "EndToEndNotJudged");
  m.def(
      "judge_gradient",
      [](const std::string& where, const std::string& name, std::optional<py::capsule> prod,
         py::capsule base, py::capsule ref, const std::string& expected, bool keep) {
        gs::GradientRuns runs;
        if (prod) runs.prod = from_capsule(*prod, name + " (prod)");
        runs.base = from_capsule(base, name + " (base)");
        runs.ref = from_capsule(ref, name + " (ref)");
        runs.expected = dtype_named(expected);
        return gs::judge_gradient(where, name, runs, keep);
      },
      py::arg("where"), py::arg("name"), py::arg("prod"), py::arg("base"), py::arg("ref"),
      py::arg("expected"), py::arg("keep_tensors") = false,
      "a LoRA gradient of the model by the end-to-end rule (tensors as DLPack capsules; prod "
      "None where the loss does not reach it); EndToEndNotJudged for an all-zero reference");
  m.def(
      "judge_losses",
      [](const std::string& where, const py::dict& t, const std::string& prefix, int step,
         bool keep) {
        gs::LossRuns runs;
        const auto get = [&](const char* key) {
          return from_capsule(t[key].cast<py::capsule>(), std::string("losses: ") + key);
        };
        runs.prod_loss = get("prod_loss");
        runs.base_loss = get("base_loss");
        runs.ref_loss = get("ref_loss");
        runs.prod_tokens = get("prod_tokens");
        runs.base_tokens = get("base_tokens");
        runs.ref_tokens = get("ref_tokens");
        return gs::judge_losses(where, runs, prefix, step, keep);
      },
      py::arg("where"), py::arg("tensors"), py::arg("prefix") = "", py::arg("step") = 0,
      py::arg("keep_tensors") = false,
      "the model's loss and its per-token losses by the end-to-end rule; `tensors`: "
      "prod_loss, base_loss, ref_loss, prod_tokens, base_tokens, ref_tokens (DLPack capsules)");
  m.def(
      "model_case",
      [](const std::string& id, const std::string& replay, const std::string& dtype,
         const std::string& device, int64_t seed, std::vector<rp::Check> checks) {
        rp::CaseResult c;
        c.id = id;
        c.kind = "model";
        c.source = "check_model";
        c.replay = replay;
        c.spec = {
            {"kind", std::string("model")}, {"seed", seed}, {"dtype", dtype}, {"device", device}};
        c.checks = std::move(checks);
        return c;
      },
      py::arg("id"), py::arg("replay"), py::arg("dtype"), py::arg("device"), py::arg("seed"),
      py::arg("checks"), "a whole model's case (kind model) of end-to-end checks");
  m.def(
      "failed_check",
      [](const std::string& path, const std::string& message) {
        rp::Check c;
        c.path = path;
        c.failure = message;
        return c;
      },
      py::arg("path"), py::arg("message"), "a failing check: what prod raised, say");
  m.def(
      "write_dump",
      [](const std::string& path, const rp::CaseResult& c, const std::string& device) {
        rp::RunReport report;
        report.environment = gs::probe_environment(device);
        rp::DumpWriter dump(path, {});
        dump.add_case(c);
        dump.finish(report);
      },
      py::arg("path"), py::arg("case"), py::arg("device"),
      "the case as an HDF5 dump (docs/reports.md), written whole or not at all");
  m.def(
      "write_model_reports",
      [](const py::handle& report, const std::string& title, const std::string& json,
         const std::string& html, const std::string& junit) {
        const auto r = model_report(report);
        if (!json.empty()) rp::write_output_file(json, rp::model_json(r));
        if (!html.empty()) rp::write_output_file(html, rp::model_html(r, title));
        if (!junit.empty()) rp::write_output_file(junit, rp::model_junit(r, title));
      },
      py::arg("report"), py::arg("title"), py::arg("json") = "", py::arg("html") = "",
      py::arg("junit") = "",
      "check_model's report by the C++ writers (reports/model_report.h): each file named is "
      "written whole or not at all");
  py::register_exception<rp::OutputError>(m, "OutputError", PyExc_OSError);
}

}  // namespace

PYBIND11_MODULE(_gradscope, m) {
  m.doc() = "gradscope's engine for the Python package (use the gradscope package)";
  namespace gs = gradscope;
  namespace rp = gradscope::report;
  // A Python exception a case's operator raised stays in the thread's error indicator (see
  // impl::set_after_case); it belongs to that case, which already reports it.
  gs::impl::set_after_case([] {
    py::gil_scoped_acquire gil;
    PyErr_Clear();
  });
  // Bad input, a case that cannot be judged: what the command line exits 2 for.
  py::register_exception<gs::InputError>(m, "GradscopeInputError", PyExc_ValueError);

  m.def(
      "run_cli",
      [](const std::vector<std::string>& args, const std::string& program) {
        // The package imports --import's modules before calling in; the C++ side names them.
        const gs::CliHost host{program, true, python_interrupt};
        try {
          // Without the GIL: operators written in Python take it when the dispatcher calls
          // them, and autograd's device threads take it for Python backward nodes.
          py::gil_scoped_release release;
          return gs::run_cli(args, host);
        } catch (const gs::RunInterrupted&) {
          throw py::error_already_set();  // the KeyboardInterrupt PyErr_CheckSignals raised
        }
      },
      py::arg("args"), py::arg("program") = "python3 -m gradscope",
      "runs `gradscope ARGS...` in this process and returns its exit code; `program` starts "
      "the replay lines it prints");

  bind_facts(m);
  bind_kinds(m);
  bind_families(m);
  bind_results(m);
  bind_cases(m);
  bind_end_to_end(m);
}

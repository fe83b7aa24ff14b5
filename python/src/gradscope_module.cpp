// gradscope._gradscope: the command line in-process and the operator contract, for the Python
// package (python/gradscope). Importing it also registers gradscope's own operators
// (torch.ops.gradscope.*): the harness's copy of the kernels carries the registration.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <string>
#include <vector>

#include "gradscope/faults.h"
#include "gradscope/op_schemas.h"
#include "harness/cli/cli.h"
#include "harness/impl/impl_ops.h"

namespace py = pybind11;

PYBIND11_MODULE(_gradscope, m) {
  m.doc() = "gradscope's command line and operator schemas (use the gradscope package)";
  // A Python exception a case's operator raised stays in the thread's error indicator (see
  // impl::set_after_case); it belongs to that case, which already reports it.
  gradscope::impl::set_after_case([] {
    py::gil_scoped_acquire gil;
    PyErr_Clear();
  });
  m.def(
      "run_cli",
      [](const std::vector<std::string>& args, const std::string& program) {
        // Without the GIL: operators written in Python take it when the dispatcher calls
        // them, and autograd's device threads take it for Python backward nodes.
        py::gil_scoped_release release;
        // The package imports --import's modules before calling in; the C++ side names them.
        return gradscope::run_cli(args, gradscope::CliHost{program, true});
      },
      py::arg("args"), py::arg("program") = "python3 -m gradscope",
      "runs `gradscope ARGS...` in this process and returns its exit code; `program` starts "
      "the replay lines it prints");
  py::dict schemas;
  for (const auto& op : gradscope::kOpSchemas) schemas[op.name] = op.schema;
  m.attr("OP_SCHEMAS") = schemas;
  m.attr("OP_SCHEMA_VERSION") = gradscope::kOpSchemaVersion;
  m.attr("FAULT_SWITCHES") = gradscope::fault_switches_linked();
}

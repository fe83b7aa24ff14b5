"""gradscope: proves quantized-LoRA training kernels compute the right gradients.

    python -m gradscope run cases/smoke/lora_w.toml --impl myns --import mypackage.ops

runs the command line in this process (every argument of `gradscope`, plus `--import MODULE`
to import modules that register operators with torch.library first), and

    gradscope.check("cases/smoke/lora_w.toml", impl="myns", imports=["mypackage.ops"])

runs the same from a test and returns the verdicts, raising AssertionError on a failing check.
The operators an implementation registers: docs/implementations.md, or OP_SCHEMAS here.
"""
import ctypes
import os

# The system's C++ runtime first, in the global scope: a torch built with a static libstdc++
# exports that copy's symbols, and the extension (compiled against this system's headers) must
# not bind to them while the process also holds the system's copy: that mix crashed in the
# first std::ostream insertion on the GPU machine's torch build (docs/python.md).
try:
    ctypes.CDLL("libstdc++.so.6", mode=os.RTLD_GLOBAL)
except OSError:
    pass

import torch  # noqa: E402,F401  (loads libtorch before the extension that links it)
import scipy_openblas32  # noqa: E402  (the reference's BLAS, a dependency)

# The extension links the reference's BLAS, which lives in that package's folder: loaded here by
# its path, as torch is for libtorch, since the extension carries no search path to it.
ctypes.CDLL(os.path.join(scipy_openblas32.get_lib_dir(), scipy_openblas32.get_library(True)))

from ._gradscope import (FAULT_SWITCHES, OP_SCHEMA_VERSION, OP_SCHEMAS, CheckStatus,  # noqa: E402
                         ModelFamily, Outcome, families)
from .api import check, define_ops, list_cases, make_case  # noqa: E402
from .check_module import check_module  # noqa: E402
from .cli import main  # noqa: E402
from .errors import GradscopeInputError, ModuleRefused  # noqa: E402
from .model_check import ModelReport, ModuleResult, Refusal, check_model  # noqa: E402
from .quant_linear import QuantLinear  # noqa: E402
from .results import Case, Check  # noqa: E402

__all__ = [
    "Case",
    "Check",
    "CheckStatus",
    "GradscopeInputError",
    "Outcome",
    "FAULT_SWITCHES",
    "OP_SCHEMAS",
    "OP_SCHEMA_VERSION",
    "ModelFamily",
    "ModelReport",
    "ModuleRefused",
    "ModuleResult",
    "QuantLinear",
    "Refusal",
    "check",
    "check_model",
    "check_module",
    "define_ops",
    "families",
    "list_cases",
    "make_case",
    "main",
]

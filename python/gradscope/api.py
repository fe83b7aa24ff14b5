"""check(), list_cases(), make_case() and define_ops(): the engine's cases and runs through
the binding, as typed values (python/src/gradscope_module.cpp)."""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Dict, Iterable, List, Optional, Sequence, Union

from . import _gradscope
from .errors import GradscopeInputError
from .results import Case, Check, failure_lines, from_result

if TYPE_CHECKING:
    import torch

__all__ = ["Case", "Check", "GradscopeInputError", "check", "define_ops", "failure_lines",
           "import_modules", "list_cases", "make_case", "run_cases", "select"]


def import_modules(modules: Iterable[str]) -> None:
    """Imports each module (they register an implementation's operators with torch.library)."""
    for name in modules:
        if not isinstance(name, str) or not name:
            raise GradscopeInputError(f"--import {name!r}: expected a module name")
        try:
            importlib.import_module(name)
        # Anything the module raises at import, SystemExit and KeyboardInterrupt included, is
        # a fault of that input: exit 2 from the command line, an exception from check(),
        # never the process ending from inside gradscope with the module's own code.
        except BaseException as e:
            what = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
            if isinstance(e, SystemExit):
                what = f"SystemExit({e.code!r}) (the module called sys.exit at import)"
            raise GradscopeInputError(f"--import {name}: {what}") from e


def define_ops(library, names: Optional[Iterable[str]] = None) -> None:
    """Defines the contract's operators (all but the optional decoder_layer, or `names`) in a
    torch.library.Library("ns", "DEF"), so an implementation registers only their kernels:
    library.impl(name, fn, key)."""
    for name in names if names is not None else OP_SCHEMAS_ORDER:
        library.define(_gradscope.OP_SCHEMAS[name])


# What define_ops(library) defines; the optional decoder_layer only when named.
OP_SCHEMAS_ORDER = ("dequantize", "lora_w", "lora_qkv", "lora_mlp")


def _strings(value: Union[None, str, Sequence[str]], argument: str) -> List[str]:
    if value is not None and not isinstance(value, (str, list, tuple)):
        raise GradscopeInputError(f"{argument}={value!r}: expected a str or a list of str")
    values = [] if value is None else [value] if isinstance(value, str) else list(value)
    bad = [v for v in values if not isinstance(v, str)]
    if bad:
        raise GradscopeInputError(f"{argument}: expected a str or a list of str, got {bad[0]!r}")
    return values


def select(cases: Union[str, Sequence[str]] = (), *, suite: Optional[str] = None,
           filter: Union[None, str, Sequence[str]] = None, device: Optional[str] = None,
           dtype: Optional[str] = None, seed: Optional[int] = None) -> List[_gradscope.Case]:
    """The command line's case selection: case files (or a suite; smoke without either), the
    overrides, and the id globs of `filter` (a case is selected when one matches)."""
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or seed < 0):
        raise GradscopeInputError(f"seed={seed!r}: expected a whole number >= 0")
    for argument, value in (("suite", suite), ("device", device), ("dtype", dtype)):
        if value is not None and not isinstance(value, str):
            raise GradscopeInputError(f"{argument}={value!r}: expected a str")
    return _gradscope.select_cases(_strings(cases, "cases"), suite or "",
                                   _strings(filter, "filter"), device or "", dtype or "",
                                   -1 if seed is None else seed)


def run_cases(cases: Sequence[_gradscope.Case], *, impl: str = "gradscope",
              imports: Iterable[str] = (), ops_libraries: Iterable[str] = (),
              json_path: Optional[str] = None, dump: Optional[str] = None,
              junit_path: Optional[str] = None, html_path: Optional[str] = None,
              allow_unsupported: bool = False) -> tuple:
    """Runs the engine's cases in this process: (the cases' records, the run's verdict)."""
    args = _gradscope.RunArgs()
    args.impl = impl
    args.imports = _strings(list(imports), "imports")
    args.ops_libraries = _strings(list(ops_libraries), "ops_libraries")
    for name, path in (("json", json_path), ("dump", dump), ("junit", junit_path),
                       ("html", html_path)):
        if path is not None and not isinstance(path, str):
            raise GradscopeInputError(f"{name}={path!r}: expected a file name")
        setattr(args, name, path or "")
    args.allow_unsupported = allow_unsupported
    results, verdict = _gradscope.run(list(cases), args)
    return [from_result(r) for r in results], verdict


def check(
    cases: Union[str, Sequence[str]] = (),
    *,
    suite: Optional[str] = None,
    impl: str = "gradscope",
    imports: Iterable[str] = (),
    ops_libraries: Iterable[str] = (),
    filter: Union[None, str, Sequence[str]] = None,
    device: Optional[str] = None,
    dtype: Optional[str] = None,
    seed: Optional[int] = None,
    json_path: Optional[str] = None,
    dump: Optional[str] = None,
    junit_path: Optional[str] = None,
    html_path: Optional[str] = None,
    raise_on_failure: bool = True,
    allow_unsupported: bool = False,
    raise_on_invalid: bool = True,
) -> List[Case]:
    """Runs the cases (files, or a suite) with `impl` as prod and returns one Case per case.

    `filter` is a glob or a list of globs (a case is selected when one matches its id).
    `json_path`, `dump`, `junit_path`, `html_path`: the reports `gradscope run` writes.
    Raises GradscopeInputError when the run cannot judge its cases (bad input, a case invalid
    before any check ran, or `impl` declined every case, unless allow_unsupported; a case whose
    checks ran but could not be judged, such as an attention past the floor's model, too
    unless raise_on_invalid is False, which returns it with status "invalid") and, unless
    raise_on_failure is False, AssertionError listing every failing check with its message and
    the command that replays the case.
    """
    __tracebackhide__ = True  # pytest shows the caller's line and the message, not ours
    imports = _strings(list(imports), "imports")
    import_modules(imports)
    selected = select(cases, suite=suite, filter=filter, device=device, dtype=dtype, seed=seed)
    return judge(run_cases(selected, impl=impl, imports=imports, ops_libraries=ops_libraries,
                           json_path=json_path, dump=dump, junit_path=junit_path,
                           html_path=html_path, allow_unsupported=allow_unsupported),
                 f"implementation {impl}", raise_on_failure, raise_on_invalid)


def judge(run: tuple, who: str, raise_on_failure: bool, raise_on_invalid: bool) -> List[Case]:
    """A run's records, raising as check() documents: a failure before a case not judged."""
    __tracebackhide__ = True
    result, verdict = run
    # Exit 2 with no invalid case: nothing was judged (every case declined). An invalid case
    # without checks is bad input; one whose checks ran but could not be judged is a result,
    # raised after any failure unless raise_on_invalid is False.
    invalid = [c for c in result if c.status == "invalid"]
    bad_input = [c for c in invalid if not c.checks]
    if (verdict.exit_code == 2 and not invalid) or bad_input:
        raise GradscopeInputError("\n".join(c.input_error or "" for c in bad_input)
                                  or verdict.message or f"exit code {verdict.exit_code}")
    failing = [c for c in result if c.status == "fail"]
    not_judged = [f"{c.id}: not judged: {c.input_error}" for c in invalid]
    if failing and raise_on_failure:
        lines = [f"{len(failing)} of {len(result)} gradscope cases failed ({who})"]
        for c in failing:
            lines += failure_lines(c)
        if not_judged:
            lines += [f"{len(not_judged)} more could not be judged:"] + not_judged
        raise AssertionError("\n".join(lines))
    if not_judged and raise_on_invalid:
        raise GradscopeInputError("\n".join(not_judged))
    return result


def make_case(
    cases: Union[str, Sequence[str]] = (),
    *,
    suite: Optional[str] = None,
    filter: Union[None, str, Sequence[str]] = None,
    device: Optional[str] = None,
    dtype: Optional[str] = None,
    seed: Optional[int] = None,
) -> Dict[str, "torch.Tensor"]:
    """One case's generated tensors by name (x, output gradients, each projection's packed base,
    adapters and bias, a stack's norms: the names a case's `tensors` file takes), on the host.
    The selection must hold exactly one case; raises GradscopeInputError otherwise."""
    __tracebackhide__ = True
    from torch.utils.dlpack import from_dlpack

    selected = select(cases, suite=suite, filter=filter, device=device, dtype=dtype, seed=seed)
    if len(selected) != 1:
        raise GradscopeInputError(f"make_case: the selection holds {len(selected)} cases; "
                                  "select one (filter=ID)")
    return {name: from_dlpack(t) for name, t in _gradscope.generate(selected[0]).items()}


def list_cases(
    cases: Union[str, Sequence[str]] = (),
    *,
    suite: Optional[str] = None,
    filter: Union[None, str, Sequence[str]] = None,
    device: Optional[str] = None,
    dtype: Optional[str] = None,
    seed: Optional[int] = None,
) -> List[str]:
    """The ids of the selected cases (files, or a suite), in the order `check` runs them.

    Raises GradscopeInputError for a selection gradscope refuses (a bad file, no match)."""
    __tracebackhide__ = True
    return [c.id for c in select(cases, suite=suite, filter=filter, device=device, dtype=dtype,
                                 seed=seed)]

"""gradscope's pytest plugin (entry point `pytest11: gradscope`).

`pytest --gradscope-suite smoke` (or `--gradscope-cases FILE`) collects one test item per case,
named by the case id, so `-k` selects cases as it selects tests. An implementation under test
comes in with `--gradscope-impl NS` and `--gradscope-import MODULE` (or
`--gradscope-ops-library FILE`). A failing case fails with gradscope's own message (each failing
check, then the command that replays the case) and none of gradscope's frames; a case the
implementation declines is a skip with its reason; a case gradscope cannot judge (a bad file,
a missing operator) is an error with gradscope's message.

Without those options the plugin collects nothing and offers fixtures: `gradscope_check`
(`gradscope.check` with the command line's implementation, imports, device and seed),
`gradscope_check_module` and `gradscope_check_model` (`gradscope.check_module` and
`gradscope.check_model` with its seed).
docs/python.md describes both.
"""
from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any, Callable, Iterator, List, Optional, Union

import pytest

if TYPE_CHECKING:
    from _pytest._code.code import TerminalRepr

from . import api
from .check_module import check_module
from .model_check import ModelReport, check_model


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("gradscope", "gradscope: gradients of quantized-LoRA kernels")
    group.addoption("--gradscope-suite", action="append", default=[], metavar="NAME",
                    help="collect one test per case of this suite (cases/NAME); repeatable")
    group.addoption("--gradscope-cases", action="append", default=[], metavar="FILE",
                    help="collect one test per case of this case file; repeatable")
    group.addoption("--gradscope-filter", action="append", default=[], metavar="GLOB",
                    help="only case ids matching one of these globs; repeatable")
    group.addoption("--gradscope-impl", default="gradscope", metavar="NS",
                    help="operator namespace of the implementation under test (default gradscope)")
    group.addoption("--gradscope-import", action="append", default=[], metavar="MODULE",
                    help="import this module first (it registers --gradscope-impl); repeatable")
    group.addoption("--gradscope-ops-library", action="append", default=[], metavar="FILE",
                    help="load this shared library first (it registers --gradscope-impl)")
    group.addoption("--gradscope-device", choices=("cpu", "cuda"), default=None,
                    help="override every case's device")
    group.addoption("--gradscope-seed", type=int, default=None, metavar="SEED",
                    help="override every case's seed (and check_module's)")


class _Options:
    def __init__(self, config: pytest.Config) -> None:
        get = config.getoption
        self.suites: List[str] = get("gradscope_suite")
        self.cases: List[str] = get("gradscope_cases")
        self.filters: List[str] = get("gradscope_filter")
        self.impl: str = get("gradscope_impl")
        self.imports: List[str] = get("gradscope_import")
        self.ops_libraries: List[str] = get("gradscope_ops_library")
        self.device: Optional[str] = get("gradscope_device")
        self.seed: Optional[int] = get("gradscope_seed")

    def sources(self) -> Iterator[dict]:
        """Each selection as check()'s keyword arguments: a suite, or the case files."""
        for suite in self.suites:
            yield {"suite": suite}
        if self.cases:
            yield {"cases": list(self.cases)}


class CaseFailed(AssertionError):
    """A case's failing checks, as gradscope words them."""


class GradscopeCase(pytest.Item):
    """One gradscope case: runs it alone and judges it by gradscope's rule."""

    def __init__(self, *, case_id: str, source: dict, options: _Options, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.case_id = case_id
        self.source = source
        self.options = options
        self.extra_keyword_matches.add(case_id.split(".", 1)[0])  # the kind, for -k

    def runtest(self) -> None:
        o = self.options
        try:
            [case] = api.check(**self.source, filter=[self.case_id], impl=o.impl,
                               imports=o.imports, ops_libraries=o.ops_libraries, device=o.device,
                               seed=o.seed, raise_on_failure=False, allow_unsupported=True)
        except api.GradscopeInputError as e:
            raise CaseFailed(f"not judged (exit 2): {e}") from None
        if case.status == "unsupported":
            # A Python kernel's exception comes with torch's frame list ("At: ..."): the reason
            # is the text before it.
            reason = (case.unsupported or "").split("\n\nAt:", 1)[0].strip()
            pytest.skip(f"{o.impl} declines this case: {reason}")
        if case.status != "pass":
            lines = api.failure_lines(case)
            lines[0] = f"{case.id}: {case.status}"
            raise CaseFailed("\n".join(lines))

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style=None
                     ) -> Union[str, "TerminalRepr"]:
        if isinstance(excinfo.value, CaseFailed):
            return str(excinfo.value)
        return super().repr_failure(excinfo, style=style)

    def reportinfo(self):
        return self.path, None, f"gradscope case {self.case_id}"


class GradscopeSelection(pytest.Collector):
    """The cases of one suite or of the given case files."""

    def __init__(self, *, source: dict, options: _Options, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.source = source
        self.options = options

    def collect(self) -> List[GradscopeCase]:
        o = self.options
        try:
            ids = api.list_cases(**self.source, filter=o.filters or None, device=o.device,
                                 seed=o.seed)
        except api.GradscopeInputError as e:
            raise pytest.UsageError(f"gradscope: {e}") from None
        return [GradscopeCase.from_parent(self, name=i, case_id=i, source=self.source,
                                          options=o) for i in ids]


# First, so that -k and -m deselect gradscope's items like any other.
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config,
                                  items: List[pytest.Item]) -> None:
    options = _Options(config)
    for source in options.sources():
        name = f"gradscope[{source['suite']}]" if "suite" in source else "gradscope[cases]"
        selection = GradscopeSelection.from_parent(session, name=name, nodeid=name,
                                                   source=source, options=options)
        cases = selection.collect()
        # Reported like any collector's result, so that the counts ("N tests collected",
        # deselected) include the cases.
        collected: List[Union[pytest.Item, pytest.Collector]] = list(cases)
        config.hook.pytest_collectreport(
            report=pytest.CollectReport(selection.nodeid, "passed", None, collected))
        items.extend(cases)


@pytest.fixture
def gradscope_check(request: pytest.FixtureRequest) -> Callable[..., List[api.Case]]:
    """gradscope.check with the command line's --gradscope-impl, --gradscope-import,
    --gradscope-ops-library, --gradscope-device and --gradscope-seed as defaults."""
    o = _Options(request.config)
    return functools.partial(api.check, impl=o.impl, imports=o.imports,
                             ops_libraries=o.ops_libraries, device=o.device, seed=o.seed)


@pytest.fixture
def gradscope_check_module(request: pytest.FixtureRequest) -> Callable[..., List[api.Case]]:
    """gradscope.check_module with the command line's --gradscope-seed as the default seed:
    `def test_layer(gradscope_check_module): gradscope_check_module(my_layer)`."""
    seed = _Options(request.config).seed
    return functools.partial(check_module, seed=1 if seed is None else seed)


@pytest.fixture
def gradscope_check_model(request: pytest.FixtureRequest) -> Callable[..., ModelReport]:
    """gradscope.check_model with the command line's --gradscope-seed as the default seed: a
    failing model fails the test with its first divergence and the table, without gradscope's
    frames: `def test_model(gradscope_check_model): gradscope_check_model(my_model)`."""
    seed = _Options(request.config).seed
    return functools.partial(check_model, seed=1 if seed is None else seed)

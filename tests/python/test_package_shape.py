"""The package's shape: every module of python/gradscope imports alone, and the graph of the
package's own module-level imports has no cycle."""
from __future__ import annotations

import ast
import json
import pathlib
import re
import subprocess
import sys
from typing import Any, Dict, List, Set

import pytest

import gradscope

PACKAGE = pathlib.Path(gradscope.__file__).parent


def _modules() -> List[str]:
    names = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        names.append(".".join(("gradscope",) + parts))
    return names


def _imports(module: str) -> Set[str]:
    """The package's modules `module` imports at its top level (not inside functions)."""
    parts = module.split(".")
    path = PACKAGE.joinpath(*parts[1:])
    path = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
    package = parts if path.name == "__init__.py" else parts[:-1]
    found = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else []
            target = ".".join(base + ([node.module] if node.module else [])) if node.level \
                else node.module or ""
            candidates = [target] + [f"{target}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            candidates = [a.name for a in node.names]
        else:
            continue
        found.update(c for c in candidates if c in MODULES and c != module)
    return found


MODULES = _modules()


# Imports each module in a fresh state of the package: every gradscope module is dropped from
# sys.modules first (the compiled _gradscope aside: an extension is loaded once per process),
# so a module that works only after another has been imported fails here. torch and the peers
# stay loaded, which makes this one process instead of one interpreter per module.
_WORKER = r"""
import importlib, json, sys, traceback
import torch  # noqa: F401  (loaded once for every module below)
out = {}
for module in sys.argv[1:]:
    for name in [n for n in sys.modules if n.split(".")[0] == "gradscope"
                 and n != "gradscope._gradscope"]:
        del sys.modules[name]
    before = sorted(n for n in sys.modules if n.split(".")[0] == "gradscope")
    try:
        importlib.import_module(module)
        out[module] = ["ok", "", before]
    except ModuleNotFoundError as e:
        out[module] = ["missing", str(e.name or ""), traceback.format_exc(), before]
    except BaseException:
        out[module] = ["error", traceback.format_exc(), before]
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def imported_alone() -> Dict[str, List[Any]]:
    modules = [m for m in MODULES if not m.endswith("__main__")]
    r = subprocess.run([sys.executable, "-c", _WORKER] + modules, capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stderr
    result: Dict[str, List[Any]] = json.loads(r.stdout.splitlines()[-1])
    return result


@pytest.mark.parametrize("module", MODULES)
def test_imports_alone(module: str, imported_alone: Dict[str, List[Any]]) -> None:
    if module.endswith("__main__"):
        pytest.skip("runs the command line")
    state = imported_alone[module]
    if state[0] == "missing" and not state[1].startswith("gradscope"):
        pytest.skip(f"{module} adapts a peer that is not installed ({state[1]})")
    assert state[0] == "ok", state[1]


def test_each_import_starts_fresh(imported_alone: Dict[str, List[Any]]) -> None:
    """What makes the worker's imports "alone": before each, no gradscope module but the
    extension was loaded."""
    for module, state in imported_alone.items():
        assert state[-1] in ([], ["gradscope._gradscope"]), (module, state[-1])


def test_no_import_cycle() -> None:
    graph: Dict[str, Set[str]] = {m: _imports(m) for m in MODULES}
    # A package imports its parent's __init__ first: not an edge of the graph.
    for m in graph:
        graph[m] = {t for t in graph[m] if not m.startswith(t + ".")}
    state: Dict[str, int] = {}

    def visit(m: str, trail: List[str]) -> None:
        state[m] = 1
        for t in sorted(graph[m]):
            if state.get(t) == 1:
                cycle = trail[trail.index(t):] + [t] if t in trail else [m, t]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if t not in state:
                visit(t, trail + [t])
        state[m] = 2

    for m in MODULES:
        if m not in state:
            visit(m, [m])


def test_planted_cycle_is_found(monkeypatch: pytest.MonkeyPatch) -> None:
    """The cycle check itself fails on a cycle."""
    monkeypatch.setattr(sys.modules[__name__], "_imports",
                        lambda m: {"gradscope.cli"} if m == "gradscope.api" else
                        {"gradscope.api"} if m == "gradscope.cli" else set())
    with pytest.raises(pytest.fail.Exception, match="import cycle"):
        test_no_import_cycle()

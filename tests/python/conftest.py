"""Fixtures the Python tests share: the repository's case files and test data, and the build's
programs (CTest names them in GRADSCOPE_BINARY and GRADSCOPE_OPS_LIBRARY; else build/)."""
from __future__ import annotations

import os

import pytest

# test_pytest_plugin.py runs pytest within pytest.
pytest_plugins = ["pytester"]

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


@pytest.fixture(scope="session")
def cases_dir() -> str:
    return os.path.join(ROOT, "cases")


@pytest.fixture(scope="session")
def data_dir() -> str:
    return os.path.join(ROOT, "tests", "data")


def _built(variable: str, default: str) -> str:
    path = os.environ.get(variable) or os.path.join(ROOT, "build", default)
    if not os.path.exists(path):
        pytest.fail(f"{path} does not exist: build first (scripts/build.sh) or set {variable}")
    return os.path.abspath(path)


@pytest.fixture(scope="session")
def gradscope_bin() -> str:
    return _built("GRADSCOPE_BINARY", "gradscope")


@pytest.fixture(scope="session")
def ops_library() -> str:
    return _built("GRADSCOPE_OPS_LIBRARY", os.path.join("kernels", "libgradscope_ops.so"))


@pytest.fixture(scope="session")
def lora_w(cases_dir: str) -> str:
    return os.path.join(cases_dir, "smoke", "lora_w.toml")


"""Fixtures the Python tests share: the repository's case files and test data, the build's
programs (CTest names them in GRADSCOPE_BINARY and GRADSCOPE_OPS_LIBRARY; else build/), and
the device and model shape the tests that take them run on (--device, --shape)."""
from __future__ import annotations

import os

import pytest
import torch

# test_pytest_plugin.py runs pytest within pytest.
pytest_plugins = ["pytester"]

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def pytest_addoption(parser: pytest.Parser) -> None:
    # Not the plugin's --gradscope-device: that one overrides the cases the plugin collects.
    parser.addoption("--device", choices=("cpu", "cuda"), default="cpu",
                     help="where the tests that take a device run their models and cases")
    parser.addoption("--shape", choices=("small", "7b"), default="small",
                     help="test_model_llama.py's Llama: 4 small layers, or one of Llama-2-7B's")


@pytest.fixture(scope="session")
def device(pytestconfig: pytest.Config) -> str:
    return pytestconfig.getoption("--device")


@pytest.fixture(scope="session")
def shape(pytestconfig: pytest.Config) -> str:
    return pytestconfig.getoption("--shape")


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
def loadable_ops_library(ops_library: str) -> str:
    """The ops library, for a test that loads it into this process: where the gradscope package
    (imported by its pytest plugin, where installed) registered the namespace, loading it as
    well would abort the process (one TORCH_LIBRARY per namespace), so the test is skipped."""
    if hasattr(torch.ops.gradscope, "lora_w"):
        pytest.skip("torch.ops.gradscope is registered by the gradscope package in this "
                    "process: run this file with -p no:gradscope (as CTest does)")
    return ops_library


@pytest.fixture(scope="session")
def tiny_gptq(data_dir: str) -> str:
    """The checkpoint `gradscope export` wrote into tests/data (4-bit, v1 zeros, act-order)."""
    return os.path.join(data_dir, "tiny-gptq-v1-act")


@pytest.fixture(scope="session")
def lora_w(cases_dir: str) -> str:
    return os.path.join(cases_dir, "smoke", "lora_w.toml")


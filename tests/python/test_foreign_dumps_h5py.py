"""Dumps as another tool leaves them, each a copy of a smoke lora_w dump rewritten by h5py:
1. The root `format` attribute as a variable-length string (what h5py writes for a Python str):
   gradscope still reads it.
2. An unknown schema_version: refused with exit 2 and a message saying so.
3. NaN at the same element of both files is the same value: a dump diffed with itself is clean,
   and differs from the dump without the NaN.
"""
from __future__ import annotations

import os
import shutil
import subprocess
from typing import List

import h5py
import pytest


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(tmp_path_factory.mktemp("foreign_dumps"))


@pytest.fixture(scope="module")
def dump(gradscope_bin: str, cases_dir: str, work: str) -> str:
    path = os.path.join(work, "foreign_base.h5")
    subprocess.run([gradscope_bin, "run", os.path.join(cases_dir, "smoke", "lora_w.toml"),
                    "--filter", "lora_w.fp32.*", "--quiet", "--dump", path], check=True)
    return path


def _datasets(f: h5py.File) -> List[str]:
    found: List[str] = []
    f.visititems(lambda name, obj: found.append(name) if isinstance(obj, h5py.Dataset) else None)
    return found


def show(gradscope_bin: str, path: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([gradscope_bin, "show", path], capture_output=True, text=True,
                          timeout=60)


def test_a_variable_length_format_attribute_is_read(gradscope_bin: str, dump: str,
                                                     work: str) -> None:
    vlen = os.path.join(work, "vlen.h5")
    shutil.copy(dump, vlen)
    with h5py.File(vlen, "r+") as f:
        value = f.attrs["format"]
        value = value.decode() if isinstance(value, bytes) else str(value)
        del f.attrs["format"]
        f.attrs["format"] = value  # a Python str: variable length
    with h5py.File(vlen, "r") as f:
        assert f.attrs.get_id("format").get_type().is_variable_str()
    r = show(gradscope_bin, vlen)
    assert r.returncode == 0, (r.returncode, r.stderr)
    assert "gradscope dump" in r.stdout, r.stdout


def test_an_unknown_schema_version_is_refused(gradscope_bin: str, dump: str, work: str) -> None:
    future = os.path.join(work, "future.h5")
    shutil.copy(dump, future)
    with h5py.File(future, "r+") as f:
        f.attrs["schema_version"] = 99
    r = show(gradscope_bin, future)
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert "schema_version '99'" in r.stderr, r.stderr


def test_nan_equals_nan_in_diff(gradscope_bin: str, dump: str, work: str) -> None:
    nan = os.path.join(work, "nan.h5")
    shutil.copy(dump, nan)
    with h5py.File(nan, "r+") as f:
        name = next(p for p in _datasets(f) if p.endswith("/prod"))
        values = f[name][()]
        values.flat[0] = float("nan")
        f[name][...] = values
    r = subprocess.run([gradscope_bin, "diff", nan, nan], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, (r.returncode, r.stdout[-2000:], r.stderr)
    r = subprocess.run([gradscope_bin, "diff", nan, dump], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 1, (r.returncode, r.stdout[-2000:], r.stderr)

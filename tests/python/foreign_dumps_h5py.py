"""Dumps as another tool leaves them: h5py rewrites the root `format` attribute as a
variable-length string (what h5py writes for a Python str), which gradscope must still read;
a dump of an unknown schema_version must be refused with exit 2 and a message saying so.

usage: foreign_dumps_h5py.py GRADSCOPE DUMP WORK_DIR
"""
import os
import shutil
import subprocess
import sys

import h5py

gradscope, dump, work = sys.argv[1:4]


def _datasets(f):
    found = []
    f.visititems(lambda name, obj: found.append(name) if isinstance(obj, h5py.Dataset) else None)
    return found
os.makedirs(work, exist_ok=True)


def show(path):
    return subprocess.run([gradscope, "show", path], capture_output=True, text=True, timeout=60)


vlen = os.path.join(work, "vlen.h5")
shutil.copy(dump, vlen)
with h5py.File(vlen, "r+") as f:
    value = f.attrs["format"]
    value = value.decode() if isinstance(value, bytes) else str(value)
    del f.attrs["format"]
    f.attrs["format"] = value  # a Python str: variable length
with h5py.File(vlen, "r") as f:
    assert f.attrs.get_id("format").get_type().is_variable_str()
r = show(vlen)
assert r.returncode == 0, (r.returncode, r.stderr)
assert "gradscope dump" in r.stdout, r.stdout

future = os.path.join(work, "future.h5")
shutil.copy(dump, future)
with h5py.File(future, "r+") as f:
    f.attrs["schema_version"] = 99
r = show(future)
assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
assert "schema_version '99'" in r.stderr, r.stderr
# NaN at the same element of both files is the same value: a dump diffed with itself is clean.
nan = os.path.join(work, "nan.h5")
shutil.copy(dump, nan)
with h5py.File(nan, "r+") as f:
    name = next(p for p in _datasets(f) if p.endswith("/prod"))
    values = f[name][()]
    values.flat[0] = float("nan")
    f[name][...] = values
r = subprocess.run([gradscope, "diff", nan, nan], capture_output=True, text=True, timeout=120)
assert r.returncode == 0, (r.returncode, r.stdout[-2000:], r.stderr)
r = subprocess.run([gradscope, "diff", nan, dump], capture_output=True, text=True, timeout=120)
assert r.returncode == 1, (r.returncode, r.stdout[-2000:], r.stderr)
print("foreign dumps: variable-length format read, schema_version 99 refused, NaN = NaN")

#!/usr/bin/env bash
# Installs the Python package `gradscope` from this checkout into python3 (docs/python.md):
# built against the torch already installed there (no build isolation: an isolated build
# would fetch another torch), in the developer build tree ${BUILD_DIR:-build}, so that after
# scripts/build.sh only the extension is linked (the extension never carries fault switches:
# docs/faults.md). A plain `pip install .` builds in build/python-package instead.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
BUILD_DIR=${BUILD_DIR:-build}
export CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}
"$PYTHON" -m pip install --quiet --root-user-action=ignore --no-build-isolation --no-deps \
  --config-settings=build-dir="$BUILD_DIR" \
  --config-settings=cmake.define.GRADSCOPE_BUILD_TESTS=ON .
# The installed package, not this checkout, answers from another folder.
(cd / && "$PYTHON" -m gradscope --help >/dev/null && "$PYTHON" -c \
  'import gradscope; assert not gradscope.FAULT_SWITCHES, "the package carries fault switches"')
echo "install-package: $("$PYTHON" -c 'import gradscope, os; print(os.path.dirname(gradscope.__file__))')"

#!/usr/bin/env bash
# Quickstart (2): install what is missing, build, install the Python package, run every test
# (GoogleTest, suites, Python via CTest), then the hardening job: the tests under ASan + UBSan
# and the fuzzers (clang).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/build.sh
bash scripts/install-package.sh
ctest --test-dir build --output-on-failure -j "$(nproc)"
exec bash scripts/sanitize-and-fuzz.sh

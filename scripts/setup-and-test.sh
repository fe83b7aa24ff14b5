#!/usr/bin/env bash
# Quickstart (2): install what is missing, build, install the Python package, run every test
# (GoogleTest, suites, Python via CTest), then the hardening job: the tests under ASan + UBSan
# and the fuzzers (clang). Each phase prints its wall time (docs/performance.md, "CI").
set -euo pipefail
cd "$(dirname "$0")/.."
phase() {
  local name=$1 start=$SECONDS
  shift
  "$@"
  echo "setup-and-test: $name $((SECONDS - start)) s"
}
phase dependencies bash scripts/install-deps.sh
phase build bash scripts/build.sh
phase python-package bash scripts/install-package.sh
phase ctest ctest --test-dir build --output-on-failure -j "$(nproc)"
phase hardening bash scripts/sanitize-and-fuzz.sh

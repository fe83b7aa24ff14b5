#!/usr/bin/env bash
# Quickstart (2): install what is missing, build, run every test (GoogleTest + suites via CTest).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/build.sh
exec ctest --test-dir build --output-on-failure -j "$(nproc)"

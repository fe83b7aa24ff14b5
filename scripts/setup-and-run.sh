#!/usr/bin/env bash
# Quickstart (1): install what is missing, build, install the Python package, run the default
# suite (smoke) on the CPU.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/build.sh
bash scripts/install-package.sh
exec ./build/gradscope run --suite smoke --device cpu --json build/smoke.json

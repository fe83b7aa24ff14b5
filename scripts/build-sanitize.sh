#!/usr/bin/env bash
# Builds the hardening configuration into ${BUILD_DIR:-build-sanitize}: clang, ASan + UBSan,
# libFuzzer coverage, CPU only, and only the targets the hardening job runs (the test binaries,
# the CLI they drive, the fuzzers). -O1 with line tables: what sanitizer reports need (stack
# traces with lines), at about half the compile time of -O2 -g; asserts stay on.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build-sanitize}
JOBS=${JOBS:-$(nproc)}
start=$SECONDS
mkdir -p "$BUILD_DIR"
CC=clang CXX=clang++ cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -gline-tables-only" \
  "-DCMAKE_C_FLAGS_RELWITHDEBINFO=-O1 -gline-tables-only" \
  -DGRADSCOPE_WITH_CUDA=OFF -DGRADSCOPE_SANITIZE=ON -DGRADSCOPE_FUZZ=ON >"$BUILD_DIR/configure.log" 2>&1 ||
  { cat "$BUILD_DIR/configure.log"; exit 1; }
cmake --build "$BUILD_DIR" -j "$JOBS" --target gradscope_tests reference_tests gradscope \
  case_file_fuzzer dump_reader_fuzzer safetensors_header_fuzzer against_report_fuzzer \
  checkpoint_config_fuzzer safetensors_index_fuzzer suite_walk_fuzzer
echo "build-sanitize: $((SECONDS - start)) s"

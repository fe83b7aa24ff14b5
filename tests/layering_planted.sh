#!/usr/bin/env bash
# The layering check fails on planted forbidden includes, one per kind of boundary, and names
# each; the unplanted copy passes.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for d in common reference reports kernels harness bench python/src; do
  mkdir -p "$tmp/$(dirname $d)" && cp -r "$root/$d" "$tmp/$d"
done
python3 "$root/scripts/check-layering.py" "$tmp" >/dev/null
plant() { printf '#include %s\n' "$2" >>"$tmp/$1"; }
plant reference/lora_reference.cpp '<ATen/ATen.h>'
plant reference/layer_reference.cpp '"kernels/include/gradscope/lora_ops.h"'
plant kernels/src/lora_mlp.cpp '"harness/kinds/lora_testbed.h"'
plant kernels/src/dequant_cuda.cu '<c10/core/ScalarType.h>'
plant reports/json_report.cpp '"harness/verdict/compare.h"'
plant harness/kinds/lora_testbed.cpp '"harness/cli/cli.h"'
plant harness/verdict/compare.cpp '"harness/kinds/lora_testbed.h"'
set +e
out=$(python3 "$root/scripts/check-layering.py" "$tmp")
rc=$?
set -e
echo "$out"
[[ $rc -eq 1 ]] || { echo "expected exit 1, got $rc"; exit 1; }
for f in reference/lora_reference.cpp reference/layer_reference.cpp kernels/src/lora_mlp.cpp \
  kernels/src/dequant_cuda.cu reports/json_report.cpp harness/kinds/lora_testbed.cpp \
  harness/verdict/compare.cpp; do
  grep -q "^$f:" <<<"$out" || { echo "planted include in $f not reported"; exit 1; }
done
grep -q "^7 include(s) across a forbidden boundary" <<<"$out"

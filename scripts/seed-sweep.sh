#!/usr/bin/env bash
# False-alarm sweep: runs a suite once per seed 1..N with correct kernels; every seed
# must pass. Usage: seed-sweep.sh [N=20] [SUITE=smoke] [DEVICE=cpu]
set -uo pipefail
cd "$(dirname "$0")/.."
BIN=${GRADSCOPE:-build/gradscope}
N=${1:-20}
SUITE=${2:-smoke}
DEVICE=${3:-cpu}
failed=0
for seed in $(seq 1 "$N"); do
  out=$("$BIN" run --suite "$SUITE" --device "$DEVICE" --seed "$seed" --quiet 2>&1)
  rc=$?
  echo "seed $seed: exit $rc, $(tail -n 1 <<<"$out")"
  if ((rc != 0)); then
    failed=$((failed + 1))
    grep -E "^FAIL|err\(prod\)|not bit-exact" <<<"$out" | head -n 20
  fi
done
echo "seed sweep of suite $SUITE on $DEVICE: $((N - failed)) of $N seeds passed"
((failed == 0))

#!/usr/bin/env bash
# False-alarm sweep: runs a suite once per seed with correct kernels; every seed must pass.
# Usage: seed-sweep.sh [SEEDS=1-20] [SUITE=smoke] [DEVICE=cpu]; SEEDS is N (seeds 1..N) or
# FIRST-LAST. CTest runs seeds 1-10 as two halves side by side, one thread each; 11-20 are
# run outside the gate and logged (docs/performance.md).
set -uo pipefail
cd "$(dirname "$0")/.."
BIN=${GRADSCOPE:-build/gradscope}
SEEDS=${1:-1-20}
SUITE=${2:-smoke}
DEVICE=${3:-cpu}
if [[ $SEEDS =~ ^([0-9]+)-([0-9]+)$ ]]; then
  first=${BASH_REMATCH[1]} last=${BASH_REMATCH[2]}
elif [[ $SEEDS =~ ^[0-9]+$ ]]; then
  first=1 last=$SEEDS
else
  echo "seed-sweep.sh: SEEDS must be N or FIRST-LAST, got '$SEEDS'" >&2
  exit 2
fi
failed=0
for seed in $(seq "$first" "$last"); do
  out=$("$BIN" run --suite "$SUITE" --device "$DEVICE" --seed "$seed" --quiet 2>&1)
  rc=$?
  echo "seed $seed: exit $rc, $(tail -n 1 <<<"$out")"
  if ((rc != 0)); then
    failed=$((failed + 1))
    grep -E "^FAIL|err\(prod\)|not bit-exact" <<<"$out" | head -n 20
  fi
done
n=$((last - first + 1))
echo "seed sweep of suite $SUITE on $DEVICE: $((n - failed)) of $n seeds ($first-$last) passed"
((failed == 0))

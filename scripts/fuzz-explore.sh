#!/usr/bin/env bash
# Exploratory fuzzing, outside the landing gate (docs/building.md, "Fuzzing"): each libFuzzer
# target of the hardening build runs for FUZZ_SECONDS (default 600) from a random seed, over the
# committed corpus and a growing scratch corpus kept between runs in
# build-sanitize/fuzz-corpus/NAME. A finding is written to build-sanitize/fuzz-findings; fix
# it, then add the input to tests/fuzz/corpus/NAME as regression-<what> so that the CI job
# (scripts/sanitize-and-fuzz.sh) replays it from then on.
#   usage: fuzz-explore.sh [TARGET ...]   (default: every target); the log of each run goes to
#   build-sanitize/NAME_explore.log and a summary line to standard output.
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build-sanitize}
FUZZ_SECONDS=${FUZZ_SECONDS:-600}
targets=("$@")
((${#targets[@]})) || targets=(case_file dump_reader safetensors_header against_report checkpoint_config
                               safetensors_index suite_walk)
bash scripts/build-sanitize.sh || exit 1
source scripts/sanitizer-env.sh
findings="$BUILD_DIR/fuzz-findings"
mkdir -p "$findings"
status=0
for target in "${targets[@]}"; do
  corpus="$BUILD_DIR/fuzz-corpus/$target"
  log="$BUILD_DIR/${target}_explore.log"
  mkdir -p "$corpus"
  seed=$(od -An -N4 -tu4 /dev/urandom | tr -d ' ')
  start=$SECONDS
  "$BUILD_DIR/tests/${target}_fuzzer" -seed="$seed" -max_total_time="$FUZZ_SECONDS" -timeout=5 \
    -rss_limit_mb=4096 -max_len=65536 -artifact_prefix="$findings/$target-" -print_final_stats=1 \
    "$corpus" "tests/fuzz/corpus/$target" >"$log" 2>&1
  rc=$?
  units=$(grep -m1 -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$')
  if ((rc == 0)); then
    echo "fuzz-explore: $target seed $seed, $((SECONDS - start)) s, ${units:-?} units, no finding"
  else
    status=1
    echo "fuzz-explore: $target seed $seed, $((SECONDS - start)) s: FINDING (exit $rc), $(grep -m1 -E 'ERROR|SUMMARY|timeout' "$log")"
    ls -1 "$findings" | grep "^$target-" | sed 's/^/  /'
  fi
done
exit $status

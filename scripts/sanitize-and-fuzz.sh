#!/usr/bin/env bash
# The hardening job of .ci/run, deterministic: a clang build with AddressSanitizer +
# UndefinedBehaviorSanitizer (CPU only) runs the GoogleTest binaries, then each libFuzzer target
# replays its committed corpus (tests/fuzz/corpus/NAME: seeds and every input that ever failed)
# and runs a fixed number of mutations from a fixed seed: a fixed amount of work, the corpus
# replay the same on every run (docs/building.md, "The hardening job"). Exploratory fuzzing, time-bounded and
# from random seeds, is scripts/fuzz-explore.sh. Any sanitizer report, test failure or fuzzer
# finding fails the job; a failing input is left in build-sanitize/fuzz-findings.
#   BUILD_DIR defaults to build-sanitize; FUZZ_RUNS_SCALE multiplies every fuzzer's run count.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build-sanitize}
JOBS=${JOBS:-$(nproc)}
SCALE=${FUZZ_RUNS_SCALE:-1}
[[ $JOBS =~ ^[1-9][0-9]*$ ]] || { echo "sanitize-and-fuzz: JOBS must be a whole number of at least 1, not '$JOBS'"; exit 2; }
[[ $SCALE =~ ^[0-9]+$ ]] || { echo "sanitize-and-fuzz: FUZZ_RUNS_SCALE must be a whole number, not '$SCALE'"; exit 2; }
# Mutations per target: about ten seconds each on the 2-core CI machine (the targets differ in
# speed by thirty times; docs/performance.md has the measured rates).
declare -A FUZZ_RUNS=([case_file]=60000 [dump_reader]=3000 [safetensors_header]=40000
                      [against_report]=15000 [checkpoint_config]=12000 [safetensors_index]=10000
                      [suite_walk]=15000)

bash scripts/build-sanitize.sh

source scripts/sanitizer-env.sh
export GRADSCOPE="$PWD/$BUILD_DIR/gradscope"

# side_by_side FUNCTION ARG...: runs FUNCTION ARG for each ARG, JOBS at a time (the test
# binaries and the fuzz targets leave a core idle much of the time, so side by side they finish
# sooner on the same work), each into $BUILD_DIR/FUNCTION-ARG.log; prints a line as each starts,
# then, in order, each one's summary lines, or the whole log of a failing one. Fails when any
# failed or died without a status. FUNCTION runs where errexit is off (the left of ||): it
# returns its failures itself.
side_by_side() {
  local function=$1 arg failed=0
  shift
  for arg in "$@"; do
    while (($(jobs -rp | wc -l) >= JOBS)); do wait -n || true; done
    rm -f "$BUILD_DIR/$function-$arg.rc"
    echo "sanitize-and-fuzz: $function $arg started"
    (
      rc=0
      "$function" "$arg" >"$BUILD_DIR/$function-$arg.log" 2>&1 || rc=$?
      echo "$rc" >"$BUILD_DIR/$function-$arg.rc"
    ) &
  done
  wait
  for arg in "$@"; do
    local log="$BUILD_DIR/$function-$arg.log" rc
    rc=$(cat "$BUILD_DIR/$function-$arg.rc" 2>/dev/null) || rc="none (it died)"
    if [[ $rc == 0 ]]; then
      grep -a -E '^(sanitize-and-fuzz:|\[  (PASSED|SKIPPED)  \])' "$log" || true
    else
      cat "$log"
      echo "sanitize-and-fuzz: $function $arg failed, exit status $rc"
      failed=1
    fi
  done
  return $failed
}

sanitized_tests() {  # sanitized_tests reference_tests|gradscope_tests|sharding_repeated
  local start=$SECONDS
  case $1 in
    # Ranks as threads again and again: a race among them (torch's flight recorder, fixed in
    # run_thread_ranks) crashed a single pass in CI once and repeated runs within seconds here.
    sharding_repeated)
      "$BUILD_DIR/tests/gradscope_tests" --gtest_filter='*ShardedParametersTest.ShardsRelease*' \
        --gtest_repeat=200 --gtest_brief=1 || return ;;
    *) "$BUILD_DIR/tests/$1" --gtest_brief=1 || return ;;
  esac
  echo "sanitize-and-fuzz: $1 $((SECONDS - start)) s"
}
start=$SECONDS
side_by_side sanitized_tests reference_tests gradscope_tests sharding_repeated
echo "sanitize-and-fuzz: tests under ASan+UBSan $((SECONDS - start)) s"

findings="$BUILD_DIR/fuzz-findings"
rm -rf "$findings" && mkdir -p "$findings"
# Address-space randomization off for the fuzzers: code inside the libraries they link takes
# address-dependent branches, so with it on the same seed reached different coverage from run
# to run (and so mutated differently); off, most runs of a commit reach the same coverage.
fixed_addresses=(setarch "$(uname -m)" -R)
if ! "${fixed_addresses[@]}" true 2>/dev/null; then
  echo "sanitize-and-fuzz: setarch -R is not permitted here: the fuzz runs may differ run to run"
  fixed_addresses=()
fi
fuzz() {  # fuzz TARGET: the committed corpus, then the fixed runs
  local target=$1
  local fuzzer="$BUILD_DIR/tests/${target}_fuzzer" corpus="tests/fuzz/corpus/$target"
  local log="$BUILD_DIR/${target}_fuzzer.log" start=$SECONDS
  # 1. Every committed input, whole, once: the regressions stay fixed.
  "${fixed_addresses[@]}" "$fuzzer" -timeout=5 -rss_limit_mb=4096 "$corpus"/* >"$log.replay" 2>&1 ||
    { tail -n 60 "$log.replay"; echo "sanitize-and-fuzz: ${target}_fuzzer fails on its committed corpus"; return 1; }
  # 2. A fixed seed and run count from the committed corpus. New inputs go to a scratch folder
  # made empty first (libFuzzer writes into the first folder), never into the committed one.
  # -reload=0: the corpus is not re-read from disk on a timer. -max_len bounds the mutated inputs
  # (the largest seed would otherwise set it: the 3000-level dump is 400 KB).
  local scratch="$BUILD_DIR/fuzz-scratch/$target"
  rm -rf "$scratch" && mkdir -p "$scratch" || return
  local runs=$((${FUZZ_RUNS[$target]:?no run count for $target} * SCALE))
  "${fixed_addresses[@]}" "$fuzzer" -seed=1 -runs="$runs" -timeout=5 -rss_limit_mb=4096 -max_len=65536 -reload=0 \
    -artifact_prefix="$findings/$target-" -print_final_stats=1 "$scratch" "$corpus" >"$log" 2>&1 ||
    { tail -n 60 "$log"; echo "sanitize-and-fuzz: ${target}_fuzzer found a failing input (in $findings)"; return 1; }
  # The coverage reached and the corpus grown (docs/performance.md compares runs).
  local reached units
  reached=$(grep -a -m1 -E '^#[0-9]+[[:space:]]+DONE' "$log" | grep -o 'cov: [0-9]* ft: [0-9]* corp: [0-9/a-zA-Z]*' || true)
  units=$(grep -a -m1 -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || true)
  echo "sanitize-and-fuzz: ${target}_fuzzer $((SECONDS - start)) s, corpus replayed, seed 1, ${units:-?} units, ${reached:-?}"
}
targets=(case_file dump_reader safetensors_header against_report checkpoint_config
         safetensors_index suite_walk)
start=$SECONDS
# The fuzzers' scratch files go to a temporary folder of their own, which must be empty when
# they are done (tests/fuzz/fuzz_scratch.h removes each at exit): a run leaves nothing behind.
# (A fuzzer stopped by a finding skips that; its failure is what is reported then.)
fuzz_tmp=$(mktemp -d "${TMPDIR:-/tmp}/gradscope-fuzz-tmp.XXXXXX")
trap 'rm -rf "$fuzz_tmp"' EXIT
fuzz_status=0
(export TMPDIR=$fuzz_tmp && side_by_side fuzz "${targets[@]}") || fuzz_status=$?
((fuzz_status == 0)) || exit "$fuzz_status"
left=$(ls -A "$fuzz_tmp")
if [[ -n $left ]]; then
  echo "sanitize-and-fuzz: the fuzzers left files in the temporary folder: $left"
  exit 1
fi
echo "sanitize-and-fuzz: fuzzers $((SECONDS - start)) s"

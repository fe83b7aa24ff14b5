#!/usr/bin/env bash
# The GPU check, run on the H200 machine through the device tool, from the repo root:
#   bash scripts/device-check.sh "$OUT"
# Configures against the machine's torch (python3) with toml++ carried in .devdeps,
# builds, runs the CTest suite and the smoke and gpu suites with --device cuda, and
# writes every log and JSON report into the given folder.
# STEPS picks what runs after the build (default "smoke gpu ctest memcheck"; also "bugs": the
# third-party bugs of tests/python through the Python package on CUDA;
# "killmatrix": every fault on the gpu suite (KILL_SUITE picks another); "bench": gradscope_bench, the timings against
# baselines; "training": the training and training-gpu suites with --device cuda, and the
# multi-step faults on the small training cases; "fsdp": the fsdp suite over NCCL, the
# Python FSDP2 test on 2 GPUs and the shard-by-shard loading memory bench; "determinism": the
# smoke suite twice on CUDA, compared; "determinism_layer": the
# 70B decoder layer twice on CUDA, compared; "perf": the 70B decoder layer, phase by phase, with the
# process's peak host memory; "seeds": the gpu suite's case files once per seed in SEEDS
# (default 5-10), one queue per GPU, within SEEDS_SECONDS; SEED_FILES picks the files,
# default those without 70B shapes; "profile": Nsight Compute on the 4-bit 8192 x 28672
# dequant kernel with act-order on and off, and on each adapter kernel at rank 16);
# "gpu_whole": the gpu suite in one process, with its peak host memory;
# GPU_FILES picks case files (default all). STEPS=all runs every step but killmatrix and
# seeds (fsdp only where there are 2 GPUs), most telling first. The whole script, configure
# and build included, stays within CHECK_SECONDS (default 570, inside one 10-minute device
# call): a step that no longer fits is skipped, logged, and fails the check.
set -uo pipefail
STEPS_REQUESTED=${STEPS-}
STEPS=" ${STEPS-smoke gpu ctest memcheck} "  # unset: the default; empty: build only
[[ $STEPS == " all " ]] && STEPS=" smoke gpu fsdp determinism perf bench training ctest memcheck "
has_step() { [[ $STEPS == *" $1 "* ]]; }
check_deadline=$((SECONDS + ${CHECK_SECONDS:-570}))
# GPUs this process may use (MIG instances and CUDA_VISIBLE_DEVICES included).
gpu_count=$(python3 -c 'import torch; print(torch.cuda.device_count())' 2>/dev/null || echo 0)
OUT=${1:?usage: device-check.sh OUTDIR}
# The OpenBLAS wheel carried in .devdeps (scripts/fill-devdeps.sh), for the Python package.
[[ -d .devdeps/python ]] && export PYTHONPATH=$PWD/.devdeps/python${PYTHONPATH:+:$PYTHONPATH}
BUILD_DIR=${BUILD_DIR:-build-device}
mkdir -p "$OUT"
status=0
run() {  # run NAME CMD...: log to $OUT/NAME.log, remember the first failure
  local name=$1; shift
  local left=$((check_deadline - SECONDS))
  if ((left < 10)); then
    echo "== $name: skipped, out of time (CHECK_SECONDS)" | tee -a "$OUT/summary.log"
    status=1
    return
  fi
  echo "== $name: $*" | tee -a "$OUT/summary.log"
  local start=$SECONDS
  timeout -k 10 "$left" "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  echo "   exit $rc after $((SECONDS - start)) s; last line: $(tail -n 1 "$OUT/$name.log")" | tee -a "$OUT/summary.log"
  ((rc == 0)) || status=1
}

{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)'
  nvcc --version | tail -n 2
} >"$OUT/machine.txt" 2>&1
run configure cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release
run build cmake --build "$BUILD_DIR" -j "$(nproc)"
has_step smoke && run smoke_cuda "$BUILD_DIR/gradscope" run --suite smoke --device cuda --quiet --json "$OUT/smoke_cuda.json"
# One run (and JSON report) per gpu case file, so a time bound loses at most one file.
# GPU_FILTER selects case ids (default all); the whole suite gets GPU_SUITE_SECONDS.
deadline=$((SECONDS + ${GPU_SUITE_SECONDS:-420}))
has_step gpu || GPU_FILES=""
for file in ${GPU_FILES-cases/gpu/*.toml}; do
  left=$((deadline - SECONDS))
  ((left > 10)) || { echo "   gpu suite: out of time before $file" | tee -a "$OUT/summary.log"; status=1; break; }
  name=$(basename "$file" .toml)
  run "gpu_$name" timeout "$left" "$BUILD_DIR/gradscope" run "$file" --device cuda \
    --filter "${GPU_FILTER:-*}" --json "$OUT/gpu_$name.json"
done
# The whole gpu suite as a user's gate runs it: one process, every case file, the process's
# peak host memory (docs/performance.md, "The gpu suite and the kill matrix on the H200").
has_step gpu_whole && run gpu_whole python3 scripts/peak-rss.py "$BUILD_DIR/gradscope" run \
  --suite gpu --device cuda --json "$OUT/gpu_whole.json"
if has_step bugs; then
  # The third-party bugs (tests/python/third_party_bugs.py, tail_and_pair_bugs.py) through the
  # Python package, every run on CUDA (tests/python/test_third_party_bugs.py): each must fail,
  # the correct namespace pass.
  PYTHONPATH=$PWD/$BUILD_DIR/python:$PWD/tests/python${PYTHONPATH:+:$PYTHONPATH} run bugs_cuda \
    python3 -m pytest -q tests/python/test_third_party_bugs.py --device cuda
fi
if has_step fsdp; then
  # NCCL, one GPU per rank: the cases of world size 2 and the FSDP2 test need two GPUs
  # (nvidia-h200-x2); on one, STEPS=all skips them and a named fsdp step fails.
  if ((gpu_count < 2)); then
    echo "== fsdp_cuda, fsdp2_python_cuda: skipped, $gpu_count GPU(s), 2 needed" | tee -a "$OUT/summary.log"
    [[ " ${STEPS_REQUESTED:-} " == *" fsdp "* ]] && status=1
  else
    # Capped apart (FSDP_SECONDS; the suite takes about 20 s): a collective that hangs waits
    # for NCCL's 120 s watchdog and then its abort (about 3 minutes), which would starve the steps
    # after it of the call's time.
    NCCL_DEBUG=${NCCL_DEBUG:-WARN} run fsdp_cuda timeout -k 10 "${FSDP_SECONDS:-100}" "$BUILD_DIR/gradscope" run --suite fsdp --device cuda --filter '*.w2.*' --json "$OUT/fsdp_cuda.json"
    # -s: the log keeps whether fully_shard takes the int32 words as parameters. -p no:gradscope
    # (here and for ops_from_python): the package's pytest plugin would register the ops first.
    run fsdp2_python_cuda env GRADSCOPE_OPS_LIBRARY="$PWD/$BUILD_DIR/kernels/libgradscope_ops.so" \
      python3 -m pytest -p no:gradscope -q -s tests/python/test_fsdp2_quant_linear.py --device cuda
  fi
  run ops_from_python env GRADSCOPE_OPS_LIBRARY="$PWD/$BUILD_DIR/kernels/libgradscope_ops.so" \
    GRADSCOPE_BINARY="$PWD/$BUILD_DIR/gradscope" python3 -m pytest -p no:gradscope -q \
    tests/python/test_ops_from_python.py
  # One rank's peak host and GPU memory loading a 70B layer whole vs shard by shard.
  run shard_load_cuda "$BUILD_DIR/gradscope_shard_load_bench" --device cuda --world 1,2,4,8 --json "$OUT/shard_load_cuda.json"
fi
if has_step determinism; then
  # The smoke suite twice on CUDA: identical checks in the JSON (wall times and memory
  # aside) and identical dumps (gradscope diff with zero tolerance). The dumps stay in the build
  # folder: about 20 MiB each, over what a device call brings back of a file.
  for i in 1 2; do
    run "determinism_$i" "$BUILD_DIR/gradscope" run --suite smoke --device cuda --quiet \
      --json "$OUT/det_$i.json" --dump "$BUILD_DIR/det_$i.h5" --dump-gradients-only
  done
  run determinism_dumps "$BUILD_DIR/gradscope" diff "$BUILD_DIR/det_1.h5" "$BUILD_DIR/det_2.h5" --rtol 0 --atol 0
  run determinism_json python3 -c "
import json, sys
def checks(p):
    return [c['checks'] for c in json.load(open(p))['cases']]
sys.exit(0 if checks('$OUT/det_1.json') == checks('$OUT/det_2.json') else 1)"
fi
if has_step determinism_layer; then
  # The 70B decoder layer twice on CUDA: identical checks (values, limits, floors) in the JSON.
  # The smoke suite's shapes do not reach the attention backends SDPA picks at real sizes.
  for i in 1 2; do
    run "determinism_layer_$i" "$BUILD_DIR/gradscope" run --suite perf --device cuda --quiet \
      --json "$OUT/det_layer_$i.json"
  done
  run determinism_layer_json python3 -c "
import json, sys
def checks(p):
    return [c['checks'] for c in json.load(open(p))['cases']]
a, b = checks('$OUT/det_layer_1.json'), checks('$OUT/det_layer_2.json')
differ = [x for x, y in zip(sum(a, []), sum(b, [])) if x != y]
for x in differ[:3]:
    print(x)
print(len(differ), 'of', sum(map(len, a)), 'checks differ')
sys.exit(0 if a == b else 1)"
fi
if has_step perf; then
  run perf python3 scripts/peak-rss.py "$BUILD_DIR/gradscope" run --suite perf --device cuda --json "$OUT/perf.json"
fi
if has_step bench; then
  run bench "$BUILD_DIR/gradscope_bench" --json "$OUT/bench.json"
  run adapter_bench "$BUILD_DIR/gradscope_adapter_bench"
fi
if has_step training; then
  run training_cuda "$BUILD_DIR/gradscope" run --suite training --device cuda --json "$OUT/training_cuda.json"
  for fault in zeros-rewritten-in-backward lora-B-overwritten-by-grad; do
    # Must exit 1: the fault shows only after the first step.
    run "fault_$fault" bash -c "! $BUILD_DIR/gradscope run cases/smoke/training.toml --device cuda --quiet --inject $fault"
  done
  run training_gpu "$BUILD_DIR/gradscope" run --suite training-gpu --device cuda --json "$OUT/training_gpu.json"
fi
if has_step seeds; then
  # False alarms: correct kernels must pass every seed. One queue of seeds per GPU, the
  # host's cores split between the queues (the fp64 reference runs on them).
  gpus=$gpu_count
  read -r -a seeds <<<"${SEEDS:-5 6 7 8 9 10}"
  files=${SEED_FILES:-$(ls cases/gpu/*.toml | grep -v 70b)}
  seed_seconds=${SEEDS_SECONDS:-400}
  ((seed_seconds > check_deadline - SECONDS)) && seed_seconds=$((check_deadline - SECONDS))
  seed_deadline=$((SECONDS + seed_seconds))
  mkdir -p "$OUT/seeds"
  : >"$OUT/seeds.log"
  echo "== seeds ${seeds[*]} on $gpus GPU(s): $(echo $files)" | tee -a "$OUT/summary.log"
  for ((gpu = 0; gpu < gpus; ++gpu)); do
    (
      for ((i = gpu; i < ${#seeds[@]}; i += gpus)); do
        seed=${seeds[i]}
        for file in $files; do
          name=$(basename "$file" .toml) left=$((seed_deadline - SECONDS))
          ((left > 10)) || { echo "   seed $seed $name: out of time" >>"$OUT/seeds.log"; exit 1; }
          start=$SECONDS
          CUDA_VISIBLE_DEVICES=$gpu OMP_NUM_THREADS=$(($(nproc) / gpus)) timeout -k 10 "$left" \
            "$BUILD_DIR/gradscope" run "$file" --device cuda --seed "$seed" --quiet \
            --json "$OUT/seeds/s${seed}_$name.json" >"$OUT/seeds/s${seed}_$name.log" 2>&1
          echo "   seed $seed $name: exit $? after $((SECONDS - start)) s; $(tail -n 1 "$OUT/seeds/s${seed}_$name.log")" >>"$OUT/seeds.log"
        done
      done
    ) &
  done
  wait
  cat "$OUT/seeds.log" | tee -a "$OUT/summary.log"
  # Nothing run (no GPU, no seed, no file) is a failure too.
  [[ -s $OUT/seeds.log ]] || status=1
  grep -qv ': exit 0 ' "$OUT/seeds.log" && status=1
fi
# The CPU seed sweep is CI's job; here CTest checks the build of this machine.
# GRADSCOPE_REQUIRE_CUDA: the GPU-only tests fail instead of skipping when they find no GPU.
has_step ctest && GRADSCOPE_REQUIRE_CUDA=1 run ctest ctest --test-dir "$BUILD_DIR" -j 8 --output-on-failure -E "${CTEST_EXCLUDE:-smoke_seed_sweep|kill_matrix_smoke}"
if has_step memcheck && command -v compute-sanitizer >/dev/null; then
  # Out-of-bounds reads or writes in the kernels (dequant of every width, SwiGLU, the fused ops).
  run memcheck timeout 150 compute-sanitizer --tool memcheck --error-exitcode 9 \
    "$BUILD_DIR/gradscope" run --suite smoke --device cuda --quiet --filter '*.fp16.*act*'
fi
if has_step profile; then
  # Where the act-order dequant waits: one launch each way, after two warm-ups.
  for act in on off; do
    run "profile_dequant_act_$act" ncu --kernel-name regex:dequant_gptq_kernel --launch-skip 2 \
      --launch-count 1 --section SpeedOfLight --section MemoryWorkloadAnalysis \
      --section WarpStateStats --section SchedulerStats --section Occupancy --section LaunchStats \
      "$BUILD_DIR/gradscope_bench" --only dequant --quick --bits 4 --act-order "$act" --out bf16 \
      --repeats 3
  done
  # The adapter kernels at rank 16: gradscope_adapter_bench launches each family 36 times per
  # rank (two layouts, 3 warm-ups and 15 timed each), rank 8 first; skip to rank 16's first
  # timed launch with lora_A's layout.
  for kernel in rows_times_adapter add_low_rank outer_product; do
    run "profile_adapter_$kernel" ncu --kernel-name "regex:${kernel}_kernel" --launch-skip 39 \
      --launch-count 1 --section SpeedOfLight --section MemoryWorkloadAnalysis \
      --section WarpStateStats --section Occupancy --section LaunchStats \
      "$BUILD_DIR/gradscope_adapter_bench"
  done
fi
if has_step killmatrix; then
  run killmatrix python3 scripts/kill-matrix.py "$BUILD_DIR/gradscope" --suite "${KILL_SUITE:-gpu}" \
    --device cuda --fail-fast --scoped --markdown "$OUT/kill-matrix-${KILL_SUITE:-gpu}-cuda.md"
fi
exit $status

#!/usr/bin/env bash
# Peers as implementations under test on the GPU machine (docs/peers.md), from the repo root:
#   [STEPS="..."] bash scripts/device-peers.sh OUTDIR
# The machine has no package index: the peers' wheels (and pybind11's) travel in .whl
# (carry it with .devdeps). Installs them, builds (with the Python extension), then runs the
# STEPS (default: all, in this order), each within PEER_SECONDS (default 150) and all within
# CHECK_SECONDS (default 560), one log and JSON report per run:
#   bench        python -m gradscope.bench: gradscope, fms_acceleration and peft side by side
#   fms_smoke    fms_acceleration over the smoke suite's dequant, then LoRA files
#   peft_smoke   peft over the smoke LoRA files
#   fms_gpu      fms_acceleration over PEER_GPU_FILES of the gpu suite (default: the files whose
#                cases are short with gradscope's own kernels)
#   fms_gpu_v2   the same files with every case's zero points in the v2 format (format =
#                "gptq_v2" added to each file: the files keep v1, where fms fails every case)
#   peft_gpu     peft over PEER_GPU_FILES (less the dequant files: peft has no dequantize)
#   foak_model   check_model on a small Llama patched by fms-acceleration-foak's own plugin
#                rules (tests/python/test_foak_model.py)
#   model_7b     check_model on a Llama-2-7B-shaped layer, by module, by layer and end to end
#                (tests/python/test_model_llama.py --device cuda --shape 7b)
# all on CUDA (foak_model and model_7b are not in the default STEPS).
set -uo pipefail
OUT=${1:?usage: device-peers.sh OUTDIR}
mkdir -p "$OUT"
deadline=$((SECONDS + ${CHECK_SECONDS:-560}))
BUILD_DIR=${BUILD_DIR:-build-device}
# The peers themselves; their dependencies (transformers, accelerate, pandas, triton) are the
# machine's own, for its Python, recorded in versions.txt.
python3 -m pip install --quiet --root-user-action=ignore --no-index --no-deps \
  .whl/peft-*.whl .whl/fms_acceleration*.whl >"$OUT/pip.log" 2>&1 ||
  { echo "pip install failed"; tail "$OUT/pip.log"; exit 1; }
python3 - >"$OUT/versions.txt" 2>&1 <<'PY'
import importlib.metadata as m
for p in ("torch", "triton", "peft", "transformers", "accelerate", "fms-acceleration",
          "fms-acceleration-foak", "fms-acceleration-peft", "pybind11"):
    try:
        print(p, m.version(p))
    except m.PackageNotFoundError:
        print(p, "missing")
PY
{ cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release &&
  cmake --build "$BUILD_DIR" -j "$(nproc)"; } >"$OUT/build.log" 2>&1 ||
  { echo "build failed"; tail -20 "$OUT/build.log"; exit 1; }
# The OpenBLAS wheel carried in .devdeps (scripts/fill-devdeps.sh): the package imports it.
export PYTHONPATH=$PWD/$BUILD_DIR/python:$PWD/.devdeps/python
status=0
peer_run() {  # peer_run NAME NAMESPACE MODULE FILES...
  local name=$1 ns=$2 module=$3; shift 3
  local left=$((deadline - SECONDS))
  ((left > 20)) || { echo "== $name: skipped, out of time" | tee -a "$OUT/summary.log"; return; }
  local limit=$((left < ${PEER_SECONDS:-150} ? left : ${PEER_SECONDS:-150}))
  local start=$SECONDS
  timeout -k 5 "$limit" python3 -m gradscope run "$@" --device cuda --quiet --impl "$ns" \
    --import "$module" --json "$OUT/$name.json" >"$OUT/$name.log" 2>&1
  local rc=$?
  echo "== $name: exit $rc after $((SECONDS - start)) s: $(grep ' passed, ' "$OUT/$name.log" | tail -n 1)" |
    tee -a "$OUT/summary.log"
  ((rc == 0 || rc == 1)) || status=1
}
steps=${STEPS:-bench fms_smoke peft_smoke fms_gpu fms_gpu_v2 peft_gpu}
gpu_files=${PEER_GPU_FILES:-cases/gpu/dequant_llama2_7b.toml cases/gpu/dequant_llama2_70b.toml cases/gpu/lora_w.toml cases/gpu/lora_w_70b.toml cases/gpu/lora_w_dropout.toml cases/gpu/qkv.toml cases/gpu/qkv_70b.toml cases/gpu/mlp_llama3_8b.toml cases/gpu/realistic_lora_w.toml}
smoke_lora=$(ls cases/smoke/*.toml | grep -v '/dequant_')
smoke_dequant=$(ls cases/smoke/dequant_*.toml)
fms="fms_acceleration gradscope.adapters.fms_acceleration"
for step in $steps; do
  case $step in
  bench)
    left=$((deadline - SECONDS))
    start=$SECONDS
    timeout -k 5 "$((left < 240 ? left : 240))" python3 -m gradscope.bench --impl gradscope \
      --impl fms_acceleration --impl peft --import gradscope.adapters.fms_acceleration \
      --import gradscope.adapters.peft --json "$OUT/bench.json" >"$OUT/bench.log" 2>&1
    echo "== bench: exit $? after $((SECONDS - start)) s" | tee -a "$OUT/summary.log" ;;
  fms_smoke)
    peer_run fms_smoke_dequant $fms $smoke_dequant
    peer_run fms_smoke_lora $fms $smoke_lora ;;
  peft_smoke) peer_run peft_smoke_lora peft gradscope.adapters.peft $smoke_lora ;;
  fms_gpu) peer_run fms_gpu $fms $gpu_files ;;
  fms_gpu_v2)
    mkdir -p /tmp/gpu_v2
    for f in $gpu_files; do  # a top-level key, before the first table
      awk 'NR == 1 { print "format = \"gptq_v2\"" } { print }' "$f" >"/tmp/gpu_v2/$(basename "$f")"
    done
    peer_run fms_gpu_v2 $fms $(for f in $gpu_files; do echo "/tmp/gpu_v2/$(basename "$f")"; done) ;;
  peft_gpu)
    peer_run peft_gpu peft gradscope.adapters.peft $(printf '%s\n' $gpu_files | grep -v '/dequant_') ;;
  foak_model | model_7b)
    left=$((deadline - SECONDS))
    # timeout 0 would mean no bound at all
    ((left > 20)) || { echo "== $step: skipped, out of time" | tee -a "$OUT/summary.log"; status=1; continue; }
    start=$SECONDS
    # -s: the log keeps each check_model call's wall time and table.
    script=(-m pytest -q -s tests/python/test_foak_model.py)
    [[ $step == model_7b ]] &&
      script=(-m pytest -q -s tests/python/test_model_llama.py --device cuda --shape 7b)
    # GRADSCOPE_REQUIRE_CUDA: no GPU or no FOAK fails test_foak_model.py instead of skipping it.
    GRADSCOPE_REQUIRE_CUDA=1 PYTHONPATH=$PYTHONPATH:$PWD/tests/python \
      timeout -k 5 "$((left < 300 ? left : 300))" python3 "${script[@]}" >"$OUT/$step.log" 2>&1
    rc=$?
    echo "== $step: exit $rc after $((SECONDS - start)) s" | tee -a "$OUT/summary.log"
    ((rc == 0)) || status=1 ;;
  *) echo "unknown step $step"; status=1 ;;
  esac
done
exit $status

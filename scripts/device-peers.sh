#!/usr/bin/env bash
# Peers as implementations under test on the GPU machine (docs/peers.md), from the repo root:
#   bash scripts/device-peers.sh OUTDIR
# The machine has no package index: the peers' wheels (and pybind11's) travel in .whl
# (carry it with .devdeps). Installs them, builds (with the Python extension), then runs,
# each within PEER_SECONDS (default 150) and all within CHECK_SECONDS (default 560):
#   fms_acceleration: the smoke suite's LoRA and dequant files, then PEER_GPU_FILES of the gpu
#   suite, on CUDA; peft: the smoke LoRA files on CUDA. One log and JSON report per run.
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
export PYTHONPATH=$PWD/$BUILD_DIR/python
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
smoke_lora=$(ls cases/smoke/*.toml | grep -v '/dequant_')
smoke_dequant=$(ls cases/smoke/dequant_*.toml)
peer_run fms_smoke_dequant fms_acceleration gradscope.adapters.fms_acceleration $smoke_dequant
peer_run fms_smoke_lora fms_acceleration gradscope.adapters.fms_acceleration $smoke_lora
peer_run peft_smoke_lora peft gradscope.adapters.peft $smoke_lora
peer_run fms_gpu fms_acceleration gradscope.adapters.fms_acceleration \
  ${PEER_GPU_FILES:-cases/gpu/dequant_llama2_7b.toml cases/gpu/lora_w.toml cases/gpu/lora_w_dropout.toml cases/gpu/qkv.toml cases/gpu/realistic_lora_w.toml}
exit $status

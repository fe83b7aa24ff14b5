#!/usr/bin/env bash
# Installs everything gradscope needs on a fresh Debian/Ubuntu machine, as root.
# Idempotent: it installs only what is missing, so a second run does nothing.
set -euo pipefail

APT_PACKAGES=(cmake ninja-build g++ ccache libeigen3-dev libhdf5-dev libgloo-dev libcli11-dev
              libtomlplusplus-dev nlohmann-json3-dev libgtest-dev
              clang libclang-rt-dev libomp-dev)  # clang: the sanitizer + libFuzzer job
TORCH_VERSION=2.11.0
# h5py: the users' reader of dumps; safetensors: Hugging Face's checkpoint library. Tests
# check both read what gradscope writes (and gradscope reads what safetensors writes).
# pybind11 and scikit-build-core build the Python package (scripts/install-package.sh); peft
# (over transformers) is the peer its adapter puts under test (python/gradscope/adapters/peft.py);
# allpairspy generates the smoke suite's pairwise files (scripts/make-pairwise-suites.py);
# pytest runs the package's pytest plugin (gradscope.pytest_plugin) under test;
# scipy-openblas32 is the BLAS of the fp64 reference's products (reference/dense_product.h),
# its library and headers taken from the wheel at build time (cmake/Dependencies.cmake);
# mypy type-checks the Python package (CTest python_types).
# Each is pinned, and what they pull in is held by scripts/python-constraints.txt, so a fresh
# machine gets the versions the tests ran with.
PY_PACKAGES=(h5py==3.16.0 safetensors==0.8.0 pybind11==3.1.0 scikit-build-core==1.1.2
             transformers==5.24.0 peft==0.21.2 allpairspy==2.5.1 pytest==9.2.0
             scipy-openblas32==0.3.34.481.3 mypy==2.4.1)
# GPTQModel's torch QuantLinear is the GPTQ base the real-stack test loads through transformers
# and optimum (tests/python/test_gptqmodel_stack.py). Its declared requirements pin numpy 2.2.6
# (torch's wheel here runs with 2.4.6) and pull in its quantization tools (datasets, pyarrow,
# torchao, maturin), which loading and training through its QuantLinear do not import; so it
# and exactly what that path imports are installed without their dependencies, each pinned.
PY_NO_DEPS=(gptqmodel==7.6.0 optimum==2.3.0 pypcre==0.6.4 logbar==0.4.15 threadpoolctl==3.8.0
            device-smi==0.5.7 tokenicer==0.0.14 defuser==0.0.28 pillow==13.0.0
            requests==2.34.2 urllib3==2.7.0 certifi==2026.5.20 charset-normalizer==3.4.7)
CONSTRAINTS="$(cd "$(dirname "$0")" && pwd)/python-constraints.txt"
PYTHON=${PYTHON:-python3}

missing=()
for pkg in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if ((${#missing[@]})); then
  echo "install-deps: apt-get install ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# LibTorch comes from the pinned PyPI wheel; CMake finds it through this interpreter.
if ! "$PYTHON" -c "import sys, torch; sys.exit(torch.__version__.split('+')[0] != '$TORCH_VERSION')" 2>/dev/null; then
  echo "install-deps: pip install torch==$TORCH_VERSION"
  "$PYTHON" -m pip install --quiet --root-user-action=ignore -c "$CONSTRAINTS" "torch==$TORCH_VERSION"
fi
# A package counts as present only at its pinned version: prints the specs that are not.
not_at_pin() {
  local spec
  for spec in "$@"; do
    "$PYTHON" -c "import sys, importlib.metadata as m; sys.exit(m.version('${spec%%==*}') != '${spec##*==}')" 2>/dev/null ||
      echo "$spec"
  done
}
mapfile -t py_missing < <(not_at_pin "${PY_PACKAGES[@]}")
if ((${#py_missing[@]})); then
  echo "install-deps: pip install ${py_missing[*]}"
  "$PYTHON" -m pip install --quiet --root-user-action=ignore -c "$CONSTRAINTS" "${py_missing[@]}"
fi
mapfile -t no_deps_missing < <(not_at_pin "${PY_NO_DEPS[@]}")
if ((${#no_deps_missing[@]})); then
  echo "install-deps: pip install --no-deps ${no_deps_missing[*]}"
  "$PYTHON" -m pip install --quiet --root-user-action=ignore --no-deps "${no_deps_missing[@]}"
fi

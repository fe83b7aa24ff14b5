#!/usr/bin/env bash
# Fills .devdeps/ with the dependencies a machine without a package index cannot install
# (toml++ and gloo's headers; the OpenBLAS wheel, unpacked into .devdeps/python), so that the
# tree can be carried there and built. Run it on a machine that reaches Debian's archive and
# PyPI; cmake/Dependencies.cmake and harness/CMakeLists.txt look in .devdeps before the
# system's paths, and scripts/device-check.sh puts .devdeps/python on PYTHONPATH.
set -euo pipefail
cd "$(dirname "$0")/.."
PACKAGES=(libtomlplusplus-dev libgloo-dev)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
(cd "$work" && apt-get download "${PACKAGES[@]}" 2>/dev/null)
rm -rf .devdeps
mkdir -p .devdeps
for deb in "$work"/*.deb; do
  dpkg -x "$deb" .devdeps
done
# The wheel at the version scripts/install-deps.sh pins.
openblas=$(grep -o 'scipy-openblas32==[0-9.]*' scripts/install-deps.sh)
python3 -m pip download --quiet --no-deps --only-binary :all: -d "$work" "$openblas"
python3 -m zipfile -e "$work"/scipy_openblas32-*.whl .devdeps/python
echo "fill-devdeps: $openblas in .devdeps/python"
echo "fill-devdeps: $(find .devdeps/usr/include -name '*.h*' | wc -l) headers from ${PACKAGES[*]}"

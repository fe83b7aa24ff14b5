#!/usr/bin/env bash
# Fills .devdeps/ with the header-only dependencies a machine without a package index cannot
# install (toml++ and gloo's headers), so that the tree can be carried there and built.
# Run it on a machine that reaches Debian's archive; cmake/Dependencies.cmake and
# harness/CMakeLists.txt look in .devdeps/usr/include before the system's include paths.
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
echo "fill-devdeps: $(find .devdeps/usr/include -name '*.h*' | wc -l) headers from ${PACKAGES[*]}"

#!/usr/bin/env bash
# Configures and builds splitserve into ./build (Release). Used by quickstart.sh and test.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
if [ ! -f build/CMakeCache.txt ]; then
  cmake -S . -B build "${generator[@]}" -DCMAKE_BUILD_TYPE=Release
fi
cmake --build build -j "$(nproc)"

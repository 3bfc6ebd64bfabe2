#!/usr/bin/env bash
# Installs dependencies, builds, and runs the whole test suite (ctest; GPU tests skip with a
# message on machines without a GPU).
set -euo pipefail
cd "$(dirname "$0")/.."
deploy/install-deps.sh
deploy/build.sh
ctest --test-dir build --output-on-failure -j "$(nproc)" --timeout 1200

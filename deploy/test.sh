#!/usr/bin/env bash
# Installs dependencies, checks the include layering (tools/check_layering.py) and the format of
# the changed files (tools/check_format.sh) before anything is built, builds, and runs the whole
# test suite (ctest; GPU tests skip with a message on machines without a GPU).
set -euo pipefail
cd "$(dirname "$0")/.."
deploy/install-deps.sh
python3 tools/check_layering.py
tools/check_format.sh
deploy/build.sh
ctest --test-dir build --output-on-failure -j "$(nproc)" --timeout 1200

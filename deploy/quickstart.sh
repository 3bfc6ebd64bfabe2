#!/usr/bin/env bash
# Installs dependencies, builds, and runs the main job on the embedded default: the reference
# DeepSeek-V4 model generating greedily from a prompt of token ids on the bundled tiny
# checkpoint (tests/data/tiny-a). Extra arguments go to splitserve-generate.
set -euo pipefail
cd "$(dirname "$0")/.."
deploy/install-deps.sh
deploy/build.sh
exec build/bin/splitserve-generate --model tests/data/tiny-a "$@"

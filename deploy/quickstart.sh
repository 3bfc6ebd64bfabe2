#!/usr/bin/env bash
# Installs dependencies, builds, and runs the system on its embedded default: `splitserve up`
# with the bundled tiny model (tiny-a's random weights and the project's generated tokenizer),
# the cpu backend and one expert worker per NUMA node, serving the OpenAI API on
# http://127.0.0.1:8000 until Ctrl-C. Extra arguments go to `splitserve up` (e.g. --port 9000,
# --model DIR).
set -euo pipefail
cd "$(dirname "$0")/.."
deploy/install-deps.sh
deploy/build.sh
exec build/bin/splitserve up "$@"

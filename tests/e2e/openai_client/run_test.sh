#!/usr/bin/env bash
# ctest driver of client_test.mjs against a FakeEngine gateway:
#
#   run_test.sh FAKE_GATEWAY_BIN WORK_DIR
#
# Installs the pinned `openai` package into WORK_DIR/node_modules (kept between runs; installed
# again when package-lock.json changes), starts FAKE_GATEWAY_BIN on a free port, runs the client
# test against it and stops it. Exits 77 (ctest's SKIP_RETURN_CODE) when node or npm is missing or
# the npm registry cannot be reached; any other failure fails the test.
#
# To run the same client test against a real system:
#   (cd WORK_DIR && SPLITSERVE_BASE_URL=http://HOST:PORT/v1 node client_test.mjs)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
gateway="$1"
work="$2"

skip() {
  echo "[  SKIPPED ] openai_client_test: $*"
  exit 77
}
command -v node >/dev/null 2>&1 || skip "node is not installed (deploy/install-deps.sh installs nodejs and npm)"
command -v npm >/dev/null 2>&1 || skip "npm is not installed (deploy/install-deps.sh installs nodejs and npm)"
major="$(node -p 'process.versions.node.split(".")[0]')"
[ "$major" -ge 18 ] || skip "node $(node --version) is older than 18"

mkdir -p "$work"
cp "$here/package.json" "$here/package-lock.json" "$here/client_test.mjs" "$work/"
stamp="$work/node_modules/.splitserve-package-lock.json"
if ! cmp -s "$here/package-lock.json" "$stamp"; then
  if ! (cd "$work" && npm ci --no-audit --no-fund --loglevel=error); then
    (cd "$work" && npm ping >/dev/null 2>&1) || skip "the npm registry cannot be reached"
    echo "openai_client_test: npm ci failed" >&2
    exit 1
  fi
  cp "$here/package-lock.json" "$stamp"
fi

"$gateway" --port 0 >"$work/gateway.out" 2>"$work/gateway.err" &
gateway_pid=$!
trap 'kill "$gateway_pid" 2>/dev/null || true; wait "$gateway_pid" 2>/dev/null || true' EXIT
port=""
for _ in $(seq 1 200); do
  port="$(sed -n 's/^port \([0-9][0-9]*\)$/\1/p' "$work/gateway.out")"
  [ -n "$port" ] && break
  kill -0 "$gateway_pid" 2>/dev/null || break
  sleep 0.05
done
if [ -z "$port" ]; then
  echo "openai_client_test: the fake gateway did not start" >&2
  cat "$work/gateway.err" >&2
  exit 1
fi
echo "openai_client_test: fake gateway on port $port, openai $(node -p "require('$work/node_modules/openai/package.json').version"), node $(node --version)"

cd "$work"
SPLITSERVE_BASE_URL="http://127.0.0.1:$port/v1" SPLITSERVE_FAKE=1 node client_test.mjs

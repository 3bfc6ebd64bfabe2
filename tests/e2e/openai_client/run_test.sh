#!/usr/bin/env bash
# ctest driver of client_test.mjs against a FakeEngine gateway, or against the real system:
#
#   run_test.sh FAKE_GATEWAY_BIN WORK_DIR
#   run_test.sh --up SPLITSERVE_BIN WORK_DIR     # `splitserve up` on the bundled tiny model
#
# With --up the model is real (random weights), so only shapes are checked, and the tool round
# trip's second half runs only if the model happens to call the tool (the fake gateway covers it);
# structured_test.mjs (constrained decoding, which needs the real engine) runs in this mode only.
#
# messages_test.mjs drives /v1/messages with the official @anthropic-ai/sdk, responses_test.mjs
# /v1/responses with the openai package, in both modes.
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
mode=fake
if [ "$1" = "--up" ]; then
  mode=up
  shift
fi
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
cp "$here/package.json" "$here/package-lock.json" "$here/client_test.mjs" \
  "$here/structured_test.mjs" "$here/messages_test.mjs" "$here/responses_test.mjs" "$work/"
stamp="$work/node_modules/.splitserve-package-lock.json"
if ! cmp -s "$here/package-lock.json" "$stamp"; then
  if ! (cd "$work" && npm ci --no-audit --no-fund --loglevel=error); then
    (cd "$work" && npm ping >/dev/null 2>&1) || skip "the npm registry cannot be reached"
    echo "openai_client_test: npm ci failed" >&2
    exit 1
  fi
  cp "$here/package-lock.json" "$stamp"
fi

if [ "$mode" = up ]; then
  # `up --port P` also takes P+1, P+2, ...: a free block of ports, not a single one.
  port="$(python3 "$here/../../common/free_port_block.py")" ||
    { echo "openai_client_test: no free block of ports"; exit 1; }
  "$gateway" up --port "$port" >"$work/up.out" 2>&1 &
  up_pid=$!
  trap 'kill "$up_pid" 2>/dev/null || true; wait "$up_pid" 2>/dev/null || true' EXIT
  if ! node -e '
    const url = process.argv[1];
    const until = Date.now() + 300000;
    (async () => {
      while (Date.now() < until) {
        try { if ((await fetch(url)).status === 200) process.exit(0); } catch (e) {}
        await new Promise((r) => setTimeout(r, 100));
      }
      process.exit(1);
    })();' "http://127.0.0.1:$port/ready"; then
    echo "openai_client_test: splitserve up did not become ready" >&2
    cat "$work/up.out" >&2
    exit 1
  fi
  echo "openai_client_test: splitserve up on port $port, openai $(node -p "require('$work/node_modules/openai/package.json').version"), node $(node --version)"
  cd "$work"
  export SPLITSERVE_BASE_URL="http://127.0.0.1:$port/v1" SPLITSERVE_ROOT="http://127.0.0.1:$port" \
    SPLITSERVE_MODEL=tiny
  node client_test.mjs && node structured_test.mjs && node messages_test.mjs && node responses_test.mjs
  exit $?
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
SPLITSERVE_ROOT="http://127.0.0.1:$port" SPLITSERVE_MODEL=deepseek-v4 SPLITSERVE_FAKE=1 \
  node messages_test.mjs
SPLITSERVE_BASE_URL="http://127.0.0.1:$port/v1" SPLITSERVE_MODEL=deepseek-v4 SPLITSERVE_FAKE=1 \
  node responses_test.mjs

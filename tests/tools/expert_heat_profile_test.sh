#!/usr/bin/env bash
# tools/expert_heat_profile.py against `splitserve up` on the bundled model: after a request, the
# GPU worker's routing counts come out as a profile for --gpu-experts-profile (format, version,
# the model's 16 experts, its 7 layers, as many choices as the request routed: tokens x 4 a layer).
#   expert_heat_profile_test.sh SOURCE_DIR SPLITSERVE_BIN WORK_DIR
set -euo pipefail
src="$1"
splitserve="$2"
work="$3"
mkdir -p "$work"
fail() {
  echo "expert_heat_profile_test: FAILED: $*" >&2
  exit 1
}
port="$(python3 "$src/tests/common/free_port_block.py")"  # up takes port+1, ... too
"$splitserve" up --port "$port" --log-dir "$work/up-logs" >"$work/up.out" 2>&1 &
up=$!
trap 'kill "$up" 2>/dev/null || true; wait "$up" 2>/dev/null || true' EXIT
for _ in $(seq 1 600); do
  grep -q "workers: 127.0.0.1:" "$work/up.out" 2>/dev/null && break
  kill -0 "$up" 2>/dev/null || { cat "$work/up.out" >&2; fail "splitserve up exited"; }
  sleep 0.1
done
grep -q "workers: 127.0.0.1:" "$work/up.out" || fail "splitserve up not ready in 60 s"
# The GPU worker's metrics are on the first port after the coordinator's.
curl -sf "http://127.0.0.1:$port/v1/completions" -H 'Content-Type: application/json' \
  -d '{"model": "tiny", "prompt": "Hello there", "max_tokens": 5, "ignore_eos": true}' \
  >"$work/completion.json" || fail "completion request"
python3 "$src/tools/expert_heat_profile.py" "http://127.0.0.1:$((port + 1))/metrics" \
  >"$work/heat.json" || fail "the tool"
python3 - "$work/heat.json" "$work/completion.json" <<'PY' || fail "the profile above"
import json, sys
p = json.load(open(sys.argv[1]))
usage = json.load(open(sys.argv[2]))["usage"]
tokens = usage["prompt_tokens"] + usage["completion_tokens"] - 1  # the last token is not run
assert p["format"] == "splitserve-expert-heat" and p["version"] == 1, p
assert p["n_experts"] == 16, p["n_experts"]
assert sorted(p["layers"], key=int) == [str(l) for l in range(7)], list(p["layers"])
for layer, counts in p["layers"].items():
    assert len(counts) == 16 and sum(counts) == tokens * 4, (layer, sum(counts), tokens)
print(f"expert_heat_profile_test: 7 layers, {tokens} tokens x 4 choices each")
PY

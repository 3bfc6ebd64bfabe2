#!/usr/bin/env bash
# Prefix caching on the cuda backend end to end (issue 26), for the GPU machine: `splitserve up
# --backend cuda` on tiny-a with one and two pipeline stages (tiny's [0,4)+[4,7) split has 2 and 1
# window blocks: the tables' fixed blocks differ from a stage's), serving prompts that are prefixes
# of one another -- so they resume from snapshots earlier prompts left at their last block
# boundary, at prompt ends inside a group of 4, of 128 and inside the window -- once with prefix
# caching and once with --no-enable-prefix-caching. Greedy texts must be equal; the logprobs'
# largest difference is printed (the cached run's chunks start at the resume points, the other's
# do not: bit-identity with the same chunk boundaries is cuda_snapshot_test's).
#   SS_BIN=DIR [SS_UP_ARGS="--gpu-prefill-threshold off"] bash tests/device/prefix_cache.sh OUT
# (the routed experts of a prefill chunk run streamed on the GPU or on the expert workers by the
# chunk's rows and a measured policy: the two paths agree within the golden tolerances, not bit
# for bit, so pin the path with --gpu-prefill-threshold to compare exactly.)
set -uo pipefail
cd "$(dirname "$0")/../.."
source tests/device/env.sh
out=${1:?usage: tests/device/prefix_cache.sh OUT}
bin=${SS_BIN:-build/bin}
binlibs=${LD_LIBRARY_PATH:-}
if [ "$bin" != build/bin ]; then prebuilt_library_path "$bin"; binlibs=$LD_LIBRARY_PATH; unset LD_LIBRARY_PATH; fi
mkdir -p "$out"
port=18300
for stages in 1 2; do
  for mode in on off; do
    flag=--enable-prefix-caching
    [ "$mode" = off ] && flag=--no-enable-prefix-caching
    env LD_LIBRARY_PATH="$binlibs" "$bin/splitserve" up --backend cuda --stages "$stages" \
      --model tests/data/tiny-a --tokenizer models/tiny/tokenizer.json --port "$port" $flag \
      --log-dir "$out/up_${stages}_$mode" ${SS_UP_ARGS:-} >"$out/up_${stages}_$mode.log" 2>&1 &
    pid=$!
    for _ in $(seq 1 240); do
      http GET "http://127.0.0.1:$port/ready" >/dev/null 2>&1 && break
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.5
    done
    python3 - "$port" "$out/r_${stages}_$mode.json" <<'EOF'
import json, random, sys, urllib.request
port, path = int(sys.argv[1]), sys.argv[2]
rng = random.Random(2026)
base = [rng.randrange(16, 1000) for _ in range(760)]
rows = []
for n in (130, 131, 300, 258, 317, 700, 740):
    body = {"model": "tiny-a", "prompt": base[:n], "max_tokens": 6, "temperature": 0, "logprobs": 5}
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        r = json.load(urllib.request.urlopen(req, timeout=120))
        c = r["choices"][0]
        rows.append({"n": n, "text": c["text"], "lp": c["logprobs"]["token_logprobs"],
                     "top": c["logprobs"]["top_logprobs"],
                     "cached": r["usage"]["prompt_tokens_details"]["cached_tokens"]})
    except Exception as e:  # noqa: BLE001 -- reported, compared as a failure
        rows.append({"n": n, "error": str(e)})
json.dump(rows, open(path, "w"))
EOF
    kill -TERM "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
  done
  python3 - "$out/r_${stages}_on.json" "$out/r_${stages}_off.json" "$stages" <<'EOF'
import json, sys
on, off, stages = json.load(open(sys.argv[1])), json.load(open(sys.argv[2])), sys.argv[3]
for a, b in zip(on, off):
    if "error" in a or "error" in b:
        print(f"prefix cache, {stages} stage(s), prompt {a['n']}: FAILED {a.get('error', '')} {b.get('error', '')}")
        continue
    diff = max(abs(x - y) for x, y in zip(a["lp"], b["lp"]))
    print(f"prefix cache, {stages} stage(s), prompt {a['n']}: cached {a['cached']} (off: {b['cached']}), "
          f"text {'equal' if a['text'] == b['text'] else 'DIFFERENT'}, logprob max |diff| {diff:.2e}")
EOF
done

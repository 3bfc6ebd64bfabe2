#!/usr/bin/env bash
# DeepSeek-V4-Flash end to end on one machine: dummy weights at Flash's shapes (`--load-format
# dummy`, models/flash/config.json), served by `splitserve up --backend cuda` with the routed
# experts in the expert workers on the host's cores; every figure beside its limit measured in the
# same run. For the H200 machine (one call, well inside 10 minutes with the default phases).
#
#   bash bench/flash_e2e.sh OUT [PHASES]
#     PHASES: comma-separated, default "decode,2048,8192": `decode` (concurrency 1, 4, 8, 16),
#             prompt lengths for prefill (one request, 1 output token), and followup:CONTEXT:NEW
#             (bench/prefix_followup.py: a conversation's next turn against the prefix cache).
#   env: SS_BIN (binaries, default build/bin), SS_FLASH_EXPERTS (routed experts per layer,
#        default 160: Flash's 256 need ~151 GB of RAM for the experts alone; top-6 of fewer
#        experts reads and computes the same bytes and FLOPs per token), SS_PORT (18000),
#        SS_DECODE_TOKENS (output tokens per decode request, 64), SS_DECODE_CONCURRENCY ("1 4 8 16"),
#        SS_MAX_MODEL_LEN (`up`'s --max-model-len, 40960: room for the phases' longest prompt),
#        SS_UP_ARGS (more `splitserve up` flags, e.g. "--isa avx2"), SS_PHASE_HOOK (a command run
#        after each phase with the phase as its argument, while `up` still runs: e.g. to have a
#        tracer write its records, tests/device/streamed_trace.py).
#
# Limits, measured in the same run:
#   decode:  streaming read of the expert workers' cores (splitserve-bench-experts --stream_only,
#            pinned to the cores `up` gave the expert workers) / routed bytes per step, per token:
#            a step of c sequences reads the distinct experts of c tokens, E (1 - (1 - 6/E)^c)
#            of them per layer (random routing), 13,369,344 B each, 43 layers: 3.45 GB at c = 1.
#   prefill, experts on the CPU: the expert FLOPs / the expert engine's GFLOP/s in the same
#            phase, i.e. the tokens over the expert engine's seconds (its own metric,
#            expert_call_seconds): the rate if nothing but the routed experts took time.
#            6 x 3 x 2 x 4096 x 2048 x 43 = 13.0 GFLOP a token.
#   prefill, experts streamed to the GPU (the GPU worker's "streamed step" log lines): the bytes
#            streamed / the pinned H2D rate the worker measured at start: the rate if nothing but
#            the copies took time.
# Writes OUT/summary.txt (the figures) and OUT/*.json (bench serve results), OUT/up/ (logs).
set -uo pipefail
cd "$(dirname "$0")/.."
source tests/device/env.sh
out=${1:?usage: bench/flash_e2e.sh OUT [PHASES]}
phases=${2:-decode,2048,8192}
bin=${SS_BIN:-build/bin}
experts=${SS_FLASH_EXPERTS:-160}
port=${SS_PORT:-18000}
decode_tokens=${SS_DECODE_TOKENS:-64}
decode_concurrency=${SS_DECODE_CONCURRENCY:-1 4 8 16}
up_args=${SS_UP_ARGS:-}
max_model_len=${SS_MAX_MODEL_LEN:-40960}
# Prebuilt binaries (tests/device/pack.sh) find their libraries through `run`; python3 and curl
# keep the system's.
binlibs=${LD_LIBRARY_PATH:-}
if [ "$bin" != build/bin ]; then prebuilt_library_path "$bin"; binlibs=$LD_LIBRARY_PATH; unset LD_LIBRARY_PATH; fi
run() { env LD_LIBRARY_PATH="$binlibs" "$@"; }
mkdir -p "$out"
summary="$out/summary.txt"
: >"$summary"
say() { echo "$*" | tee -a "$summary"; }

model=$(mktemp -d /tmp/flash-dummy-XXXXXX)
cp models/flash/config.json "$model/"
gzip -dc tests/data/tokenizer/tokenizer.json.gz >"$model/tokenizer.json"
overrides="{\"n_routed_experts\": $experts}"
say "flash_e2e: $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null | head -1); $(nproc) CPUs; $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)"
say "model: models/flash/config.json, --load-format dummy, --hf-overrides '$overrides' --max-model-len $max_model_len $up_args"

t0=$(date +%s.%N)
# Started by env directly, not through run(): a backgrounded function is a subshell, whose PID would
# take the SIGTERM below while `up` itself kept running (and held its store and the GPU).
env LD_LIBRARY_PATH="$binlibs" "$bin/splitserve" up --backend cuda --load-format dummy --model "$model" \
  --hf-overrides "$overrides" --max-model-len "$max_model_len" --port "$port" --log-dir "$out/up" \
  --ready-timeout-s 500 $up_args >"$out/up.log" 2>&1 &
up_pid=$!
cleanup() {
  kill -TERM "$up_pid" 2>/dev/null
  wait "$up_pid" 2>/dev/null
  rm -rf "$model"
}
trap cleanup EXIT
ready=0
for _ in $(seq 1 1000); do
  if http GET "http://127.0.0.1:$port/ready" >/dev/null 2>&1; then ready=1; break; fi
  kill -0 "$up_pid" 2>/dev/null || break
  sleep 0.5
done
t1=$(date +%s.%N)
if [ "$ready" != 1 ]; then
  say "not ready after $(python3 -c "print(round($t1 - $t0, 1))") s"; tail -30 "$out/up.log"
  for f in "$out"/up/*.log; do echo "== $f"; tail -15 "$f"; done
  exit 1
fi
say "start to ready: $(python3 -c "print(round($t1 - $t0, 1))") s ($(grep -m1 'ready in' "$out/up.log"))"
grep -h -i "dummy\|generated\|streamed prefill" "$out"/up/*.log | head -20 | tee -a "$summary"
grep -m1 "CPUs:" "$out/up.log" | tee -a "$summary"

# The streaming-read limit on the expert workers' cores (the server idle).
expert_cpus=$(grep -m1 -o 'expert0 on [0-9,-]*' "$out/up.log" | awk '{print $3}')
stream_line=$(run taskset -c "${expert_cpus:-0-$(($(nproc) - 1))}" "$bin/splitserve-bench-experts" --stream_only | tail -1)
stream_gbps=$(echo "$stream_line" | sed -n 's/.*stream_read_gbps=\([0-9.]*\).*/\1/p')
say "streaming read on the expert cores (${expert_cpus:-all}): $stream_line"

# Worker metrics endpoints: the coordinator's port + 1 .. + children.
range=$(grep -m1 -o 'workers: 127.0.0.1:[0-9]*-[0-9]*' "$out/up.log" | sed 's/.*://')
endpoints=("$port")
if [ -n "$range" ]; then for p in $(seq "${range%-*}" "${range#*-}"); do endpoints+=("$p"); done; fi
scrape() {
  mkdir -p "$1"
  for p in "${endpoints[@]}"; do http GET "http://127.0.0.1:$p/metrics" >"$1/$p.txt"; done
}

# Finite logits: one greedy completion with the top-5 logprobs of every token.
model_id=$(http GET "http://127.0.0.1:$port/v1/models" | python3 -c 'import json,sys; print(json.load(sys.stdin)["data"][0]["id"])')
http POST "http://127.0.0.1:$port/v1/completions" \
  '{"model": "'"$model_id"'", "prompt": [100, 2000, 3000, 4000], "max_tokens": 8, "temperature": 0, "logprobs": 5}' \
  >"$out/logprobs.json"
python3 - "$out/logprobs.json" <<'EOF' | tee -a "$summary"
import json, math, sys
r = json.load(open(sys.argv[1]))
if "choices" not in r:
    print("logprobs check: no answer:", json.dumps(r)[:300]); sys.exit(0)
lp = r["choices"][0].get("logprobs") or {}
vals = [v for d in (lp.get("top_logprobs") or []) for v in (d or {}).values()]
vals += [v for v in (lp.get("token_logprobs") or []) if v is not None]
bad = [v for v in vals if not math.isfinite(v)]
print(f"logprobs check: {len(vals)} values, {len(bad)} not finite; text {r['choices'][0]['text']!r}")
EOF

bench() {  # NAME ARGS...: one bench serve run, its JSON in $out/NAME.json
  local name=$1; shift
  run "$bin/splitserve" bench serve --port "$port" --tokenizer "$model/tokenizer.json" \
    --disable-tqdm --save-result --result-dir "$out" --result-filename "$name.json" "$@" \
    >"$out/$name.txt" 2>&1 || { say "$name: bench serve failed"; tail -5 "$out/$name.txt"; }
}
field() { python3 -c "import json,sys; print(json.load(open(sys.argv[1])).get(sys.argv[2], 0))" "$1" "$2"; }

IFS=, read -ra list <<<"$phases"
for phase in "${list[@]}"; do
  if [ "${phase%%:*}" = followup ]; then
    # followup:CONTEXT:NEW -- a conversation's follow-up turn against the prefix cache.
    IFS=: read -r _ ctx new <<<"$phase"
    run python3 bench/prefix_followup.py "$port" "$model_id" "${ctx:-32768}" "${new:-500}" | tee -a "$summary"
    continue
  fi
  if [ "$phase" = decode ]; then
    for c in $decode_concurrency; do
      scrape "$out/m_before"
      bench "decode_c$c" --dataset-name random --random-input-len 16 --random-output-len "$decode_tokens" \
        --ignore-eos --num-prompts "$c" --max-concurrency "$c"
      scrape "$out/m_after"
      j="$out/decode_c$c.json"
      [ -f "$j" ] || continue
      toks=$(field "$j" total_output_tokens)
      split=$(python3 bench/flash_e2e_metrics.py "$out/m_before" "$out/m_after" --tokens "$toks" | tee "$out/split_decode_c$c.txt" | tail -1)
      python3 - "$j" "$c" "$stream_gbps" "$experts" "$split" <<'EOF' | tee -a "$summary"
import json, sys
r = json.load(open(sys.argv[1])); c = int(sys.argv[2]); gbps = float(sys.argv[3] or 0); E = int(sys.argv[4])
kv = dict(p.split("=") for p in sys.argv[5].split())
tpot = r.get("mean_tpot_ms", 0)
per_stream = 1000 / tpot if tpot else 0
agg = c * per_stream
distinct = E * (1 - (1 - 6 / E) ** c)
step_bytes = distinct * 13369344 * 43
limit = c * gbps * 1e9 / step_bytes if gbps else 0
print(f"decode c={c}: {agg:.2f} tok/s aggregate ({per_stream:.2f} per stream, mean TPOT {tpot:.1f} ms, "
      f"median ITL {r.get('median_itl_ms', 0):.1f} ms, TTFT {r.get('mean_ttft_ms', 0):.0f} ms); limit "
      f"{limit:.2f} tok/s ({distinct:.1f} distinct experts a layer, {step_bytes / 1e9:.2f} GB a step at "
      f"{gbps:.1f} GB/s); ratio {agg / limit if limit else 0:.2f}; measured expert bytes/token "
      f"{float(kv.get('bytes_per_token', 0)) / 1e9:.2f} GB; output_throughput {r.get('output_throughput', 0):.2f}; "
      f"completed {r.get('completed')} failed {r.get('failed')}")
print(f"  per step (ms, sum over layers): attention {kv.get('attention_ms')} shared+router {kv.get('moe_gpu_ms')} "
      f"routed call {kv.get('moe_cpu_ms')} (engine {kv.get('engine_ms')}, transport {kv.get('transport_ms')})")
EOF
    done
  else
    L=$phase
    streamed_before=$(cat "$out"/up/*.log 2>/dev/null | grep -c "streamed step:")
    scrape "$out/m_before"
    # --seed L: each length draws its own tokens, so no phase's prompt is a prefix-cache hit on an
    # earlier one's (the same seed makes the 8K prompt the 32K prompt's first 8K tokens).
    bench "prefill_$L" --dataset-name random --random-input-len "$L" --random-output-len 1 \
      --num-prompts 1 --max-concurrency 1 --request-timeout 600 --seed "$L"
    scrape "$out/m_after"
    j="$out/prefill_$L.json"
    [ -f "$j" ] || continue
    split=$(python3 bench/flash_e2e_metrics.py "$out/m_before" "$out/m_after" | tee "$out/split_prefill_$L.txt" | tail -1)
    # The streamed path's steps of this phase (the GPU worker logs one line each): their bytes,
    # seconds, copy-engine busy share and the pinned H2D rate the worker measured at start.
    streamed=$(cat "$out"/up/*.log 2>/dev/null | grep "streamed step:" | tail -n +"$((streamed_before + 1))" |
      python3 -c '
import re, sys
n = b = span = busy = pinned = 0.0
for line in sys.stdin:
    m = re.search(r"([0-9.]+) GB in ([0-9.]+) s \(([0-9.]+) GB/s of ([0-9.]+) pinned, copy engine busy ([0-9]+)%", line)
    if not m: continue
    n += 1; b += float(m[1]); span += float(m[2]); pinned = float(m[4]); busy += float(m[5]) / 100 * float(m[2])
print(f"steps={n:.0f} gb={b:.3f} span_s={span:.3f} pinned_gbps={pinned:.1f} busy_s={busy:.3f}")
')
    python3 - "$j" "$L" "$split" "$streamed" <<'EOF' | tee -a "$summary"
import json, sys
r = json.load(open(sys.argv[1])); L = int(sys.argv[2])
kv = dict(p.split("=") for p in sys.argv[3].split())
st = {k: float(v) for k, v in (p.split("=") for p in sys.argv[4].split())}
ttft = r.get("mean_ttft_ms", 0) / 1000
rate = L / ttft if ttft else 0
steps = max(float(kv.get("steps", 1)), 1)
if st.get("steps", 0) > 0:
    # Streamed: the limit is the copies alone, every streamed byte at the pinned H2D rate.
    copy_s = st["gb"] / st["pinned_gbps"]
    limit = L / copy_s
    print(f"prefill {L} (experts streamed to the GPU): {rate:.1f} tok/s (TTFT {ttft:.1f} s); limit "
          f"{limit:.1f} tok/s ({st['gb']:.1f} GB at the pinned {st['pinned_gbps']:.1f} GB/s: "
          f"{copy_s:.2f} s); ratio {rate / limit:.2f}; completed {r.get('completed')} failed {r.get('failed')}")
    print(f"  streamed: {st['steps']:.0f} steps, {st['gb']:.1f} GB in {st['span_s']:.2f} s: "
          f"{st['gb'] / st['span_s']:.1f} GB/s = {st['gb'] / st['span_s'] / st['pinned_gbps']:.2f} of the "
          f"pinned rate; copy engine busy {st['busy_s'] / st['span_s']:.2f} of the steps' span")
    print(f"  per prefill chunk (ms, sum over layers; {steps:.0f} chunks): attention {kv.get('attention_ms')} "
          f"MoE on the GPU (shared, router, streamed experts) {kv.get('moe_gpu_ms')}")
else:
    engine = float(kv.get("engine_s", 0))
    limit = L / engine if engine else 0
    gflops = 13.0e9 * L / engine / 1e9 if engine else 0
    print(f"prefill {L} (experts on the CPU): {rate:.1f} tok/s (TTFT {ttft:.1f} s); limit {limit:.1f} "
          f"tok/s (expert engine {engine:.1f} s, {gflops:.0f} GFLOP/s); ratio "
          f"{rate / limit if limit else 0:.2f}; completed {r.get('completed')} failed {r.get('failed')}")
    print(f"  per prefill chunk (ms, sum over layers; {steps:.0f} chunks): attention {kv.get('attention_ms')} "
          f"shared+router {kv.get('moe_gpu_ms')} routed call {kv.get('moe_cpu_ms')} (engine "
          f"{kv.get('engine_ms')}, transport {kv.get('transport_ms')})")
EOF
  fi
  if [ -n "${SS_PHASE_HOOK:-}" ]; then $SS_PHASE_HOOK "$phase"; fi
done
say "done: $(date -u +%FT%TZ)"

#!/usr/bin/env bash
# Resident routed experts' decode on the H200 machine, Flash-shaped dummy model with 64 routed
# experts a layer (models/flash/config.json, --hf-overrides '{"n_routed_experts": 64}', --load-format
# dummy, --backend cuda), in one call of ~8 minutes with the default phases:
#   SS_PACK_DIR=.devpack/f bash tests/device/pack.sh splitserve splitserve-coordinator \
#       splitserve-gpu-worker splitserve-expert-worker   # here; carry .devpack
#   SS_BIN=.devpack/f bash tests/device/resident_decode.sh OUT [PHASES]  # there
#     PHASES: comma-separated, default "table,skew,skewbase":
#       table     for each resident fraction of SS_FRACTIONS ("0 0.25 0.5", --gpu-experts) one `up`,
#                 decode at each concurrency of SS_DECODE_CONCURRENCY ("1 8"), SS_DECODE_TOKENS (32)
#                 tokens a request after 16-token prompts; the GPU worker's metrics scraped before
#                 and after each concurrency give the hit rate (routed choices served on the GPU /
#                 all, overall and per layer) and the CPU expert bytes per generated token. Prints
#                 tok/s (c x 1000 / mean TPOT), both against the 0 % row of the same concurrency.
#       skew      `up` with --dummy-router-skew SS_SKEW (0.2: the hottest quarter of each learned
#                 layer's experts takes about 2/3 of its choices, common/dummy_weights.h),
#                 --gpu-experts SS_SKEW_FRACTION (0.25) and --gpu-experts-rebalance-s
#                 SS_REBALANCE_S (5); decode at concurrency SS_SKEW_CONCURRENCY (8) for
#                 SS_SKEW_SECONDS (120), scraped every SS_WINDOW_S (10). Per
#                 window: the hit rate (all layers, and the learned-routing layers alone: the
#                 hash-routed layers 0-2 are not skewed and stay near 0.25), the hottest quarter's
#                 share (the learned layers' choices that went to the quarter of their experts
#                 chosen most in the window, splitserve:gpu_worker_expert_routed_total: what a
#                 quarter placed by frequency can serve at best), the rebalances and GB moved so
#                 far, tok/s. The placement converging shows as the learned layers' hit rate rising
#                 from about 0.25 to that share.
#       skewbase  the same with the rebalance off (--gpu-experts-rebalance-s 0) for SS_BASE_SECONDS
#                 (30): the hit rate of the even spread under the skew (about 0.25).
#       window    for each fraction of SS_FRACTIONS one `up` and one request at concurrency 1 long
#                 enough (SS_WINDOW_TOKENS, one count per fraction, default 1200 each) that two
#                 scrapes SS_WINDOW_WARM_S (4) and SS_WINDOW_LEN_S (8) s into it see decode steps
#                 only (no prefill): per step, the step's time, the expert engine's time and the
#                 rest, G = step - engine (the GPU's step and the calls' overheads), with the
#                 per-step parts.
#   env: SS_BIN (binaries, default build/bin), SS_PORT (first `up` port, default 18400; every `up`
#        takes its own, 10 apart), SS_INPUT_LEN (the prompts' tokens, default 16: a window at a
#        longer context), SS_BENCH_ARGS (more `bench serve` flags for every run, e.g.
#        "--temperature 0.7"), SS_UP_ARGS (more `up` flags for every run), SS_REBALANCE_S=none
#        (pass no --gpu-experts-rebalance-s: for a build without it, both skew phases then keep
#        the even placement).
# Writes OUT/summary.txt (the tables), OUT/<run>/ (up's logs, scrapes, bench results), OUT/*.jsonl
# (one JSON line per measured interval, tests/device/resident_decode_metrics.py).
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
source tests/device/env.sh
out=${1:?usage: tests/device/resident_decode.sh OUT [PHASES]}
phases=${2:-table,skew,skewbase}
bin=${SS_BIN:-build/bin}
port=${SS_PORT:-18400}
fractions=${SS_FRACTIONS:-0 0.25 0.5}
concurrency=${SS_DECODE_CONCURRENCY:-1 8}
decode_tokens=${SS_DECODE_TOKENS:-32}
input_len=${SS_INPUT_LEN:-16}
bench_args=${SS_BENCH_ARGS:-}
skew=${SS_SKEW:-0.2}
rebalance_s=${SS_REBALANCE_S:-5}
skew_seconds=${SS_SKEW_SECONDS:-120}
base_seconds=${SS_BASE_SECONDS:-30}
window=${SS_WINDOW_S:-10}
skew_fraction=${SS_SKEW_FRACTION:-0.25}
skew_concurrency=${SS_SKEW_CONCURRENCY:-8}
up_args=${SS_UP_ARGS:-}
metrics="python3 tests/device/resident_decode_metrics.py"
# Prebuilt binaries (tests/device/pack.sh) find their libraries through `run`; python3 and curl
# keep the system's.
binlibs=${LD_LIBRARY_PATH:-}
if [ "$bin" != build/bin ]; then
  prebuilt_library_path "$bin"
  binlibs=$LD_LIBRARY_PATH
  unset LD_LIBRARY_PATH
fi
mkdir -p "$out"
summary="$out/summary.txt"
: >"$summary"
say() { echo "$*" | tee -a "$summary"; }

model=$(mktemp -d /tmp/flash-resident-XXXXXX)
cp models/flash/config.json "$model/"
gzip -dc tests/data/tokenizer/tokenizer.json.gz >"$model/tokenizer.json"
overrides='{"n_routed_experts": 64}'
up_pid=""
up_port=""
cleanup() {
  if [ -n "$up_pid" ]; then
    kill -TERM "$up_pid" 2>/dev/null
    wait "$up_pid" 2>/dev/null
  fi
  rm -rf "$model"
}
trap cleanup EXIT
say "resident_decode: $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null | head -1); $(nproc) CPUs"
say "model: models/flash/config.json, --load-format dummy, --hf-overrides '$overrides' $up_args"

# start_up DIR ARGS...: `up` on a port of its own with the run's flags; waits for /ready (sets
# up_pid, up_port and endpoints: the coordinator's port and the workers' metrics ports).
# Returns 1 (with the logs' tails) when it is not ready.
start_up() {
  local dir=$1
  shift
  mkdir -p "$dir"
  up_port=$port
  port=$((port + 10))
  local t0
  t0=$(date +%s.%N)
  # shellcheck disable=SC2086  # SS_UP_ARGS splits into flags
  env LD_LIBRARY_PATH="$binlibs" "$bin/splitserve" up --backend cuda --load-format dummy \
    --model "$model" --hf-overrides "$overrides" --max-model-len 8192 --kv-tokens 65536 \
    --port "$up_port" --log-dir "$dir/up" --ready-timeout-s 300 $up_args "$@" >"$dir/up.log" 2>&1 &
  up_pid=$!
  local ready=0
  for _ in $(seq 1 600); do
    if http GET "http://127.0.0.1:$up_port/ready" >/dev/null 2>&1; then
      ready=1
      break
    fi
    kill -0 "$up_pid" 2>/dev/null || break
    sleep 0.5
  done
  if [ "$ready" != 1 ]; then
    say "$(basename "$dir"): not ready ($*)"
    tail -20 "$dir/up.log"
    for f in "$dir"/up/*.log; do
      echo "== $f"
      tail -10 "$f"
    done
    stop_up
    return 1
  fi
  say "$(basename "$dir"): ready in $(python3 -c "import time; print(round(time.time() - $t0, 1))") s ($*)"
  grep -h -i "resident experts\|router skew" "$dir"/up/*.log 2>/dev/null | head -4 | tee -a "$summary"
  local range
  range=$(grep -m1 -o 'workers: 127.0.0.1:[0-9]*-[0-9]*' "$dir/up.log" | sed 's/.*://')
  endpoints=("$up_port")
  if [ -n "$range" ]; then
    for p in $(seq "${range%-*}" "${range#*-}"); do endpoints+=("$p"); done
  else
    endpoints+=($((up_port + 1)))  # up_plan.cc: the first GPU worker's metrics port
  fi
}

stop_up() {
  [ -n "$up_pid" ] || return 0
  kill -TERM "$up_pid" 2>/dev/null
  wait "$up_pid" 2>/dev/null
  up_pid=""
}

scrape() {  # DIR: every endpoint's /metrics and the epoch time
  mkdir -p "$1"
  date +%s.%N >"$1/time"
  for p in "${endpoints[@]}"; do http GET "http://127.0.0.1:$p/metrics" >"$1/$p.txt"; done
}

bench() {  # DIR NAME ARGS...: one bench serve run, its JSON in DIR/NAME.json
  local dir=$1 name=$2
  shift 2
  # shellcheck disable=SC2086  # SS_BENCH_ARGS splits into flags
  env LD_LIBRARY_PATH="$binlibs" "$bin/splitserve" bench serve --port "$up_port" \
    --tokenizer "$model/tokenizer.json" --disable-tqdm --save-result --result-dir "$dir" \
    --result-filename "$name.json" --dataset-name random --random-input-len "$input_len" \
    --ignore-eos $bench_args "$@" \
    >"$dir/$name.txt" 2>&1 || {
    say "$name: bench serve failed"
    tail -5 "$dir/$name.txt"
  }
}
field() { python3 -c "import json,sys; print(json.load(open(sys.argv[1])).get(sys.argv[2], 0))" "$1" "$2"; }

# phase_window: decode-only windows at concurrency 1 (see the header).
phase_window() {
  local rows="$out/window.jsonl" i=0
  : >"$rows"
  local counts=(${SS_WINDOW_TOKENS:-})
  for f in $fractions; do
    local dir="$out/window_$f" n=${counts[$i]:-1200}
    i=$((i + 1))
    start_up "$dir" --gpu-experts "$f" || continue
    bench "$dir" window --random-output-len "$n" --num-prompts 1 --max-concurrency 1 &
    local load_pid=$!
    sleep "${SS_WINDOW_WARM_S:-4}"
    scrape "$dir/w_a"
    sleep "${SS_WINDOW_LEN_S:-8}"
    scrape "$dir/w_b"
    wait "$load_pid"
    $metrics delta "$dir/w_a" "$dir/w_b" "frac=$f" "c=1" >>"$rows"
    stop_up
  done
  say ""
  say "decode-only windows at concurrency 1 (per step; G = step - engine)"
  $metrics window-table "$rows" | tee -a "$summary"
}

phase_table() {
  local rows="$out/table.jsonl"
  : >"$rows"
  for f in $fractions; do
    local dir="$out/table_$f"
    start_up "$dir" --gpu-experts "$f" || continue
    for c in $concurrency; do
      scrape "$dir/m_before_c$c"
      bench "$dir" "decode_c$c" --random-output-len "$decode_tokens" --num-prompts "$c" \
        --max-concurrency "$c"
      scrape "$dir/m_after_c$c"
      local j="$dir/decode_c$c.json" tpot=0
      [ -f "$j" ] && tpot=$(field "$j" mean_tpot_ms)
      $metrics delta "$dir/m_before_c$c" "$dir/m_after_c$c" "frac=$f" "c=$c" "tpot_ms=$tpot" >>"$rows"
    done
    stop_up
  done
  say ""
  say "decode: resident fraction x concurrency (tok/s = c x 1000 / mean TPOT; hit rate = routed choices on the GPU / all; CPU GB per generated token)"
  $metrics decode-table "$rows" | tee -a "$summary"
}

# phase_skew NAME SECONDS REBALANCE_S: skewed routing, a quarter resident, decode at
# concurrency 8 for SECONDS while scraping every $window s.
phase_skew() {
  local name=$1 seconds=$2 rebalance=$3
  local dir="$out/$name" rows="$out/$name.jsonl"
  : >"$rows"
  local rebalance_args=(--gpu-experts-rebalance-s "$rebalance")
  [ "$rebalance_s" = none ] && rebalance_args=()
  start_up "$dir" --dummy-router-skew "$skew" --gpu-experts "$skew_fraction" "${rebalance_args[@]}" ||
    return
  # More requests than the time can finish; stopped by its PID when the time is up.
  env LD_LIBRARY_PATH="$binlibs" "$bin/splitserve" bench serve --port "$up_port" \
    --tokenizer "$model/tokenizer.json" --disable-tqdm --dataset-name random \
    --random-input-len 16 --random-output-len 256 --ignore-eos --num-prompts 2000 \
    --max-concurrency "$skew_concurrency" >"$dir/load.txt" 2>&1 &
  local load_pid=$!
  scrape "$dir/m_0"
  local t0 i=0 prev="$dir/m_0"
  t0=$(date +%s)
  while [ $(($(date +%s) - t0)) -lt "$seconds" ]; do
    i=$((i + 1))
    local wake=$((t0 + i * window)) now
    now=$(date +%s)
    [ "$wake" -gt "$now" ] && sleep $((wake - now))
    scrape "$dir/m_$i"
    $metrics delta "$prev" "$dir/m_$i" "t=$((i * window))" >>"$rows"
    prev="$dir/m_$i"
    kill -0 "$load_pid" 2>/dev/null || {
      say "$name: the load ended early"
      tail -5 "$dir/load.txt"
      break
    }
  done
  kill -TERM "$load_pid" 2>/dev/null
  wait "$load_pid" 2>/dev/null
  stop_up
  say ""
  say "$name: --dummy-router-skew $skew, --gpu-experts $skew_fraction, --gpu-experts-rebalance-s $rebalance, decode at concurrency $skew_concurrency ($window s windows; rebalances and GB moved cumulative)"
  $metrics skew-table "$rows" | tee -a "$summary"
}

IFS=, read -ra list <<<"$phases"
for phase in "${list[@]}"; do
  case "$phase" in
    table) phase_table ;;
    skew) phase_skew skew "$skew_seconds" "$rebalance_s" ;;
    skewbase) phase_skew skewbase "$base_seconds" 0 ;;
    window) phase_window ;;
    *) say "unknown phase '$phase' (table, skew, skewbase, window)" ;;
  esac
done
say "done: $(date -u +%FT%TZ)"

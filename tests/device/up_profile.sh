#!/usr/bin/env bash
# Run on the GPU machine from the repository root (full pack unpacked in .devbin): where a token's
# time goes in `splitserve up` on tiny-a. For each variant (up args), one sequence of 32 tokens
# through cluster_bench, then the per-process metrics' sums and counts (layer latency parts,
# expert calls, inter-token latency).
#   bash tests/device/up_profile.sh $OUT
set -u
out=$1
export NCCL_NVLS_ENABLE=0
nccl=$(python3 -c "import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], 'lib'))" 2>/dev/null)
[ -x .devbin/splitserve ] || tar xJf .devpack/devbin.tar.xz || exit 1
export LD_LIBRARY_PATH=$PWD/.devbin:$PWD/.devbin/lib:/usr/local/cuda/lib64:${nccl}
get() {
  python3 -c "import urllib.request,sys; sys.stdout.write(urllib.request.urlopen('http://127.0.0.1:$1$2', timeout=5).read().decode())" 2>/dev/null
}
port=19000
variant() {
  local label=$1
  shift
  port=$((port + 100))
  .devbin/splitserve up --model tests/data/tiny-a --tokenizer models/tiny/tokenizer.json \
    --port $port --log-dir "$out/up_$label" "$@" > "$out/up_$label.log" 2>&1 &
  local pid=$! ok=""
  for _ in $(seq 1 300); do
    get $port /ready >/dev/null && { ok=1; break; }
    kill -0 $pid 2>/dev/null || break
    sleep 0.2
  done
  echo "== $label: up $*"
  if [ -n "$ok" ] && [ -n "${SPLIT_CPUS:-}" ]; then
    # Experiment: the expert worker's threads on cpus SPLIT_CPUS, everything else on the rest.
    for p in $(pgrep -f splitserve-expert-worker); do taskset -a -p -c "$SPLIT_CPUS" $p >/dev/null; done
    for p in $(pgrep -f 'splitserve-(gpu-worker|coordinator)'); do taskset -a -p -c "$OTHER_CPUS" $p >/dev/null; done
    echo "  expert worker on cpus $SPLIT_CPUS, GPU worker and coordinator on $OTHER_CPUS"
  fi
  if [ -n "$ok" ]; then
    timeout 120 .devbin/cluster_bench --port $port --model tiny-a --concurrency ${CONC:-1} \
      --tokens 32 --repeat 1 2>&1 | tail -1
    for p in $port $((port + 1)) $((port + 2)) $((port + 3)); do
      get $p /metrics | grep -E '^splitserve:(layer_latency_seconds|expert_call_seconds|inter_token_latency_seconds|gpu_worker_steps_total)(_sum|_count)?\{' \
        | grep -E '_sum|_count|steps_total' | sed "s/^/  [$p] /" | head -40
    done
  else
    echo "not ready"; tail -5 "$out/up_$label.log"
  fi
  kill -TERM $pid 2>/dev/null; wait $pid
}
if [ -n "${VARIANTS:-}" ]; then
  eval "$VARIANTS"
else
  variant cuda_auto --backend cuda --stages 1
  variant cuda_kv64k --backend cuda --stages 1 --kv-tokens 65536
  variant cpu --backend cpu --stages 1
fi

#!/usr/bin/env bash
# Run on the GPU machine from the repository root (full pack in .devpack/devbin.tar.xz): does a
# serving `splitserve up --backend cuda` hold its memory steady? Rounds of cluster_bench at
# changing concurrency (new decode shapes: new CUDA graphs) and cancelled requests; after each
# round the GPU's used memory (nvidia-smi) and every worker's resident set (VmRSS).
#   bash tests/device/up_soak.sh $OUT [rounds, default 6]
set -u
out=$1
rounds=${2:-6}
export NCCL_NVLS_ENABLE=0
nccl=$(python3 -c "import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], 'lib'))" 2>/dev/null)
[ -x .devbin/splitserve ] || tar xJf .devpack/devbin.tar.xz || exit 1
export LD_LIBRARY_PATH=$PWD/.devbin:$PWD/.devbin/lib:/usr/local/cuda/lib64:${nccl}
port=19500
.devbin/splitserve up --backend cuda --model tests/data/tiny-a --tokenizer models/tiny/tokenizer.json \
  --port $port --kv-tokens 65536 --log-dir "$out/up" > "$out/up.log" 2>&1 &
pid=$!
for _ in $(seq 1 300); do
  python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$port/ready', timeout=2)" 2>/dev/null && break
  sleep 0.2
done
state() {
  local gpu rss=""
  gpu=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -i 0)
  for p in $(pgrep -f 'splitserve-(gpu-worker|expert-worker|coordinator)'); do
    rss="$rss $(basename "$(readlink /proc/$p/exe)" | sed 's/splitserve-//')=$(awk '/VmRSS/{print $2}' /proc/$p/status)kB"
  done
  echo "$1: GPU 0 used ${gpu} MiB;$rss"
}
state "ready"
for r in $(seq 1 "$rounds"); do
  conc=$(( (r % 4) * 2 + 1 ))
  timeout 120 .devbin/cluster_bench --port $port --model tiny-a --concurrency $conc --tokens 64 \
    --repeat 1 > "$out/bench_$r.log" 2>&1
  # Requests cut off mid-stream (the client goes away).
  for i in 1 2 3 4; do
    timeout 0.3 python3 -c "
import urllib.request, json
req = urllib.request.Request('http://127.0.0.1:$port/v1/completions', data=json.dumps({'model': 'tiny-a', 'prompt': [0, $i, 2, 3], 'max_tokens': 200, 'stream': True}).encode(), headers={'Content-Type': 'application/json'})
r = urllib.request.urlopen(req); r.read(100)" 2>/dev/null
  done
  sleep 0.5
  state "round $r (concurrency $conc): $(tail -1 "$out/bench_$r.log" | grep -o 'concurrent_tok_s=[0-9.]*')"
done
kill -TERM $pid; wait $pid
echo "up exit: $?"

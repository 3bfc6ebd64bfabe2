#!/usr/bin/env bash
# Run on the GPU machine from the repository root: decode throughput of `splitserve up --backend
# cuda` on tiny-a (cluster_bench --port: one sequence against N concurrent ones) with the packed
# binaries (B) and with a baseline splitserve-gpu-worker swapped in (A), A, B, A, B. Pack here:
#   bash tests/device/pack.sh
#   mkdir -p .devpack/up_base && cp <baseline build>/bin/splitserve-gpu-worker .devpack/up_base/ \
#     && strip .devpack/up_base/splitserve-gpu-worker
# then the device tool with carry [".devpack/devbin.tar.xz", ".devpack/up_base"]:
#   bash tests/device/pp_up.sh $OUT [up args, default --stages 2]
set -u
out=$1
shift
args=("$@")
[ ${#args[@]} -gt 0 ] || args=(--stages 2)
export NCCL_NVLS_ENABLE=0
nccl=$(python3 -c "import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], 'lib'))" 2>/dev/null)
[ -x .devbin/splitserve ] || tar xJf .devpack/devbin.tar.xz || exit 1
export LD_LIBRARY_PATH=$PWD/.devbin:$PWD/.devbin/lib:/usr/local/cuda/lib64:${nccl}
# The launcher starts the binaries beside it: A is a copy of .devbin with the baseline worker.
rm -rf /tmp/pp_up_a && cp -r .devbin /tmp/pp_up_a && cp .devpack/up_base/splitserve-gpu-worker /tmp/pp_up_a/
ready() {
  python3 -c "import urllib.request,sys; urllib.request.urlopen('http://127.0.0.1:$1/ready', timeout=2)" 2>/dev/null
}
port=18700
run() {
  local label=$1 dir=$2
  port=$((port + 100))
  "$dir/splitserve" up --backend cuda --model tests/data/tiny-a --tokenizer models/tiny/tokenizer.json \
    --port $port --log-dir "$out/up_$label" "${args[@]}" > "$out/up_$label.log" 2>&1 &
  local pid=$! ok=""
  for _ in $(seq 1 300); do
    ready $port && { ok=1; break; }
    kill -0 $pid 2>/dev/null || break
    sleep 0.2
  done
  if [ -n "$ok" ]; then
    timeout 300 "$dir/cluster_bench" --port $port --model tiny-a --concurrency 8 --tokens 48 \
      --repeat 3 > "$out/bench_$label.log" 2>&1
    echo "$label: $(tail -1 "$out/bench_$label.log")"
  else
    echo "$label: not ready"; tail -5 "$out/up_$label.log"
  fi
  kill -TERM $pid 2>/dev/null; wait $pid
}
nvidia-smi -L
echo "up ${args[*]}"
for round in 1 2; do
  run A$round /tmp/pp_up_a
  run B$round .devbin
done

#!/usr/bin/env bash
# Run on the GPU machine from the repository root, after tests/device/pack.sh here (see there).
# profile call: ncu of the bench's --profile steps (GPU 0) while the full bench runs (GPU 1)
set -u
out=$1; tarball=${2:-.devpack/devbin.tar.xz}
export NCCL_NVLS_ENABLE=0
tar xJf "$tarball"
nccl=$(python3 -c "import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], 'lib'))" 2>/dev/null)
export LD_LIBRARY_PATH="$PWD/.devbin:$PWD/.devbin/lib:/usr/local/cuda/lib64:${nccl}"
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
echo "ncu=$NCU nccl=$nccl"
( CUDA_VISIBLE_DEVICES=1 timeout 200 .devbin/cuda_backend_layer_bench /tmp/ssb1 > $out/bench.log 2>&1; echo "bench rc=$?" ) &
bp=$!
CUDA_VISIBLE_DEVICES=0 timeout 200 "$NCU" --clock-control none --profile-from-start off \
  --metrics gpu__time_duration.sum --csv --print-units base \
  .devbin/cuda_backend_layer_bench /tmp/ssb0 --profile > $out/ncu.csv 2> $out/ncu.err
echo "ncu rc=$?"
wait $bp
python3 - $out/ncu.csv <<'PY'
import csv, sys, collections
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
h = rows[0]; rows = rows[1:]
ik, iv, im = h.index('Kernel Name'), h.index('Metric Value'), h.index('Metric Name')
ist = h.index('Stream') if 'Stream' in h else None
ig = h.index('Grid Size') if 'Grid Size' in h else None
by = collections.defaultdict(lambda: collections.defaultdict(float)); n = collections.defaultdict(collections.Counter)
grid = {}
for r in rows:
    if r[im] != 'gpu__time_duration.sum': continue
    k = r[ik].split('(')[0].replace('void ','').replace('ss::cuda::','').replace('(anonymous namespace)::','')
    s = r[ist] if ist is not None else '?'
    by[s][k] += float(r[iv].replace(',','')); n[s][k] += 1
    if ig is not None: grid[k] = r[ig]
for s, t in by.items():
    tot = sum(t.values())
    print(f"stream {s}: total kernel time {tot/1e3:.1f} us over {sum(n[s].values())} kernels (3 steps)")
    for k, v in sorted(t.items(), key=lambda x: -x[1]):
        print(f"{v/1e3:9.1f} us  {n[s][k]:4d} calls  {v/1e3/n[s][k]:8.2f} us/call  grid {grid.get(k,'')}  {k[:90]}")
PY
cat $out/bench.log

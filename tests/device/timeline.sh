#!/usr/bin/env bash
# Run on the GPU machine from the repository root, after tests/device/pack.sh here (see there).
# The kernel timeline of the layer bench's --profile run (6 warm-up and 3 profiled batch-1 8K
# decode steps per layer kind, ratio 4 then ratio 128; the profiled ones replay CUDA graphs),
# every kernel (graph nodes one by one) from CUPTI activity records: for the last 12 steps their
# span, the time some kernel runs (the union of kernel intervals) and the idle rest, then every
# kernel of the last profiled step of each kind with its start offset, duration and stream, so
# the critical path and the gaps can be read off.
#   bash tests/device/timeline.sh OUT [context, default 8192] [batch, default 1]
#   SS_TL_ARGS=--profile_prefill bash tests/device/timeline.sh OUT   # an 8K prefill chunk per layer
# Then also the kernels by total time over the profiled part (for a prefill: where its time goes).
# SS_TL_BIN: another layer bench binary (e.g. ab.sh's baseline, .devpack/base/...).
set -u
out=$1
ctx=${2:-8192}
batch=${3:-1}
export NCCL_NVLS_ENABLE=0
[ -x .devbin/cuda_backend_layer_bench ] || tar xJf .devpack/devbin.tar.xz || exit 1
nccl=$(python3 -c "import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], 'lib'))" 2>/dev/null)
export LD_LIBRARY_PATH="$PWD/.devbin:$PWD/.devbin/lib:/usr/local/cuda/lib64:${nccl}"
# The tracer: tests/device/kernel_trace.cc, built on the dev machine into .devpack with CUPTI
# beside it (the GPU machine has no Nsight Systems):
#   g++ -O2 -shared -fPIC -I/usr/local/cuda/include tests/device/kernel_trace.cc \
#     -L/usr/local/cuda/lib -lcupti -Wl,-rpath,'$ORIGIN' -o .devpack/libss_kernel_trace.so
#   cp -L /usr/local/cuda/lib/libcupti.so.13 .devpack/
CUDA_INJECTION64_PATH=$PWD/.devpack/libss_kernel_trace.so SS_TRACE_OUT=$out/trace.csv \
  CUDA_VISIBLE_DEVICES=0 timeout 240 ${SS_TL_BIN:-.devbin/cuda_backend_layer_bench} /tmp/ss_tl --profile --profile_context "$ctx" --profile_batch "$batch" ${SS_TL_ARGS:-} \
  > $out/trace_bench.log 2>&1
echo "traced bench rc=$?"
tail -3 $out/trace_bench.log
python3 - $out/trace.csv <<'PY'
import sys
rows = []
for line in open(sys.argv[1]):
    s, e, sid, n = line.rstrip("\n").split(",", 3)
    rows.append((int(s), int(e), int(sid), n))
rows.sort()
import shutil, subprocess
if shutil.which("c++filt"):
    uniq = sorted(set(r[3] for r in rows))
    out = subprocess.run(["c++filt"], input="\n".join(uniq), capture_output=True, text=True).stdout
    dem = dict(zip(uniq, out.split("\n")))
    rows = [(a, b, c, dem.get(d, d).replace("ss::cuda::", "").replace("(anonymous namespace)::", ""))
            for a, b, c, d in rows]
steps, cur = [], []
for r in rows:
    if cur and r[0] - max(x[1] for x in cur) > 30000:  # > 30 us idle: a new step
        steps.append(cur); cur = []
    cur.append(r)
if cur: steps.append(cur)
print(f"{len(rows)} kernels in {len(steps)} steps")
by_name = {}
for s, e, _, n in rows:
    k = n.split("(")[0][:70]
    c, t = by_name.get(k, (0, 0))
    by_name[k] = (c + 1, t + e - s)
total = sum(t for _, t in by_name.values())
print(f"kernels by total time ({total/1e3:.1f} us in all):")
for k, (c, t) in sorted(by_name.items(), key=lambda kv: -kv[1][1])[:25]:
    print(f"  {t/1e3:10.1f} us {c:6d} launches  {k}")
for si in range(max(0, len(steps) - 12), len(steps)):
    st = steps[si]
    t0 = st[0][0]; span = max(x[1] for x in st) - t0
    busy, e = 0, t0
    for s, en, _, _ in st:
        if en > e: busy += en - max(s, e); e = en
    streams = sorted(set(x[2] for x in st))
    print(f"step {si}: {len(st)} kernels, span {span/1e3:.1f} us, some kernel running "
          f"{busy/1e3:.1f} us, idle {(span-busy)/1e3:.1f} us, streams {streams}")
# The last profiled step of each layer kind: the last step, and the last one before it with another
# kernel count (steps of a few kernels, such as a compressor reset, are not layer steps).
big = [i for i, st in enumerate(steps) if len(st) > 5]
picks = [big[-1]] if big else []
for i in reversed(big):
    if picks and len(steps[i]) != len(steps[picks[0]]):
        picks.insert(0, i); break
for si in picks:
    st = steps[si]; t0 = st[0][0]
    print(f"--- step {si} kernels: start us, duration us, stream, name")
    for s, en, sid, n in st:
        print(f"{(s-t0)/1e3:8.1f} {(en-s)/1e3:7.2f}  s{sid:<3} {n[:80]}")
PY

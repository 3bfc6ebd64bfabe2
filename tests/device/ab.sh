#!/usr/bin/env bash
# Run on the GPU machine from the repository root, after tests/device/pack.sh here (see there).
# A/B of the layer bench in one run: the packed binary (B, .devbin/cuda_backend_layer_bench)
# against a baseline built from an earlier tree and packed beside it (A,
# .devpack/base/cuda_backend_layer_bench), both at once, A on GPU 0 and B on GPU 1, then swapped,
# so each side runs once on each GPU; every line carries its own same-run D2D copy. On a machine
# of one GPU the four runs take turns on it (A, B, A, B).
#   bash tests/device/ab.sh OUT [bench args...]
set -u
out=$1
shift
export NCCL_NVLS_ENABLE=0
[ -x .devbin/cuda_backend_layer_bench ] || tar xJf .devpack/devbin.tar.xz || exit 1
nccl=$(python3 -c "import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], 'lib'))" 2>/dev/null)
export LD_LIBRARY_PATH="$PWD/.devbin:$PWD/.devbin/lib:/usr/local/cuda/lib64:${nccl}"
a=.devpack/base/cuda_backend_layer_bench
b=.devbin/cuda_backend_layer_bench
[ -x "$a" ] || { echo "no baseline at $a"; exit 1; }
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
for round in 1 2; do
  if [ "$gpus" -lt 2 ]; then
    # One GPU: A then B, twice, on one checkpoint (the first run generates it).
    CUDA_VISIBLE_DEVICES=0 timeout 240 $a /tmp/ss_ab_0 "$@" > $out/A$round.log 2>&1
    ra=$?
    CUDA_VISIBLE_DEVICES=0 timeout 240 $b /tmp/ss_ab_0 "$@" > $out/B$round.log 2>&1
    rb=$?
    echo "round $round: A then B on GPU 0: rc=$ra, rc=$rb"
    continue
  fi
  if [ $round = 1 ]; then ga=0; gb=1; else ga=1; gb=0; fi
  CUDA_VISIBLE_DEVICES=$ga timeout 240 $a /tmp/ss_ab_$ga "$@" > $out/A$round.log 2>&1 &
  pa=$!
  CUDA_VISIBLE_DEVICES=$gb timeout 240 $b /tmp/ss_ab_$gb "$@" > $out/B$round.log 2>&1 &
  pb=$!
  wait $pa; ra=$?; wait $pb; rb=$?
  echo "round $round: A on GPU $ga rc=$ra, B on GPU $gb rc=$rb"
done
for f in A1 B1 A2 B2; do
  echo "== $f"
  grep -E "^D2D|decode|prefill" $out/$f.log | grep -v "launched kernel" | \
    sed -E 's/ms\/step, .* = ([0-9.]+) of D2D copy.*/ms\/step \1/'
done

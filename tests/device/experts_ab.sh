#!/usr/bin/env bash
# Expert-worker builds side by side on the device machine's host: splitserve-bench-experts at 16
# threads (or all cores) with each worker binary in turn, rounds interleaved, so builds are
# compared within one call of a shared, drifting host. Pack here (DIR: the bench, lib/ and one
# worker_NAME per build; xz keeps it small):
#   SS_PACK_DIR=.devpack/ab/x bash tests/device/pack.sh splitserve-bench-experts
#   cp build-a/bin/splitserve-expert-worker .devpack/ab/x/worker_a   # one per build, stripped
#   (cd .devpack/ab && tar cJf x.tar.xz x && rm -rf x)
# then, with carry [".devpack/ab"], on the device:
#   bash tests/device/experts_ab.sh $OUT .devpack/ab ROUNDS NAME:ISA...   # e.g. a:avx2 b:avx2
# Each run's output stays in $OUT/ab/; one summary line a run in $OUT/ab-summary.txt. Runs stop
# being started SS_AB_DEADLINE seconds (default 480) after the first, within the tool's limit.
# SS_AB_ARGS adds bench flags (e.g. --quick --workdir DIR for a try on the dev machine).
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${1:?usage: tests/device/experts_ab.sh OUT DIR ROUNDS NAME:ISA...}
dir=${2:?DIR}
rounds=${3:?ROUNDS}
shift 3
[ -d "$dir/x" ] || (cd "$dir" && tar xJf x.tar.xz)
x="$dir/x"
export LD_LIBRARY_PATH="$PWD/$x/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
data=/tmp/ss-bench-experts-data  # 7.9 GB, shared with tests/device/experts.sh
cores=$(nproc)
threads=$((cores < 16 ? cores : 16))
mkdir -p "$out/ab"
start=$(date +%s)
for r in $(seq 1 "$rounds"); do
  for vi in "$@"; do
    v=${vi%%:*}
    isa=${vi##*:}
    if [ $(($(date +%s) - start)) -ge "${SS_AB_DEADLINE:-480}" ]; then
      echo "deadline: stopped before round $r $vi" | tee -a "$out/ab-summary.txt"
      exit 0
    fi
    f="$out/ab/r${r}_${v}_$isa.txt"
    timeout 150 "$x/splitserve-bench-experts" --threads "$threads" --isa "$isa" --tokens 10 \
      --calls 60 --workdir "$data" --worker "$x/worker_$v" ${SS_AB_ARGS:-} >"$f" 2>&1
    echo "r$r $v $isa rc=$? $(grep -oE 'efficiency=.*stream_gbps=[^ ]+' "$f") $(grep -oE \
      't256_peak_ratio=[^ ]+|rss_ratio=[^ ]+' "$f" | tr '\n' ' ')" | tee -a "$out/ab-summary.txt"
  done
done

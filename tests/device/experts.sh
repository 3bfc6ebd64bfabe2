#!/usr/bin/env bash
# Issue 30's measurements of the CPU expert worker on the device machine's host, in as few calls
# as the device tool's 10-minute limit allows. Pack first (here):
#   SS_PACK_DIR=.devpack/k bash tests/device/pack.sh cpu_rates_bench splitserve-bench-experts \
#       splitserve-expert-worker expert_kernels_test act_quant_test
#   bash bench/ggml_moe/pack_ggml.sh /path/to/ggml-git .devpack/k/ggml.tar.xz   # for `ggml`
# then, with carry [".devpack/k"], one or more PARTS a call (times are rough, on 16 cores):
#   bash tests/device/experts.sh $OUT decode16          # ~3 min
#   bash tests/device/experts.sh $OUT rates scaling     # ~1 + ~5 min
#   bash tests/device/experts.sh $OUT ggml              # ~5 min (ggml built twice, one repeat)
#   bash tests/device/experts.sh $OUT amx               # ~3 min
#   SS_AB="a:avx2 b:avx2" bash tests/device/experts.sh $OUT ab   # up to SS_AB_DEADLINE (480 s)
#   bash tests/device/experts.sh $OUT passes            # up to SS_AB_DEADLINE (480 s)
# Parts:
#   decode16  splitserve-bench-experts, 16 threads (or all cores), avx512 and avx2 interleaved,
#             3 runs each: the acceptance's decode efficiency and T = 256 share of the FMA peak
#   rates     expert_kernels_test and act_quant_test, then cpu_rates_bench at 1, 2, 4, 8, 16
#             threads
#   scaling   splitserve-bench-experts at 1, 2, 4 and 8 threads, avx512 and avx2, one run each;
#             SCALE_THREADS, SCALE_ISAS and SCALE_ROUNDS (default 1, rounds interleaved) change
#             that, and no run starts SS_AB_DEADLINE seconds (default 480) after the first
#   ggml      bench/ggml_moe/ggml_compare.sh at 4, 8 and 16 threads, both builds, one repeat
#             (BUILDS=avx2 or avx512 in the environment: that build alone; its results stay in
#             /tmp/ss-ggml-compare, and a later call on the same machine reuses them unless
#             RESUME=0)
#   amx       expert_kernels_test and act_quant_test (every ISA the host has; the latter's dispatch
#             line says whether the host grants AMX), cpu_rates_bench's prefill-sized units by
#             token rows a call at 1 and 16 threads (avx2, avx512, amx), then
#             splitserve-bench-experts at 16 threads, avx512 and amx interleaved, 2 runs each
#   ab        worker builds side by side: for each NAME:ISA of $SS_AB, the bench at 16 threads
#             with worker_NAME (a binary beside the bench) and that ISA, SS_AB_ROUNDS rounds
#             (default 5) interleaved, no run started SS_AB_DEADLINE seconds after the first.
#             Pack: the bench, lib/ and one worker_NAME per build (stripped) in one folder, e.g.
#             SS_PACK_DIR=.devpack/ab/x bash tests/device/pack.sh splitserve-bench-experts, then
#             cp each build's splitserve-expert-worker there as worker_NAME; tar cJf it to carry,
#             and on the device unpack it and point SS_EXPERTS_BIN at the folder
#   passes    the engine in two passes and in one (the bench's --engine_passes 2 / 1), 16 threads,
#             avx2 and avx512, SS_AB_ROUNDS rounds (default 5) interleaved, the same deadline
# Each run's whole output stays under $OUT/experts/ (only a few files come back: the summary is
# $OUT/experts-summary.txt, one line a run).
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${1:?usage: tests/device/experts.sh OUT PART...}
shift
bin=${SS_EXPERTS_BIN:-.devpack/k}
export LD_LIBRARY_PATH="$PWD/$bin/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
data=/tmp/ss-bench-experts-data  # 7.9 GB: kept out of $OUT
cores=$(nproc)
max=$((cores < 16 ? cores : 16))
mkdir -p "$out/experts"
summary="$out/experts-summary.txt"

bench() {  # THREADS ISA TAG [WORKER [BENCH FLAG...]]
  local f="$out/experts/be_${3}_t$1_$2.txt" threads=$1 isa=$2 tag=$3
  local worker=${4:-$bin/splitserve-expert-worker}
  shift $(($# < 4 ? $# : 4))
  local keys='^efficiency=[^ ]+|tokens_per_s=[^ ]+ decode_gbps=[^ ]+ stream_gbps=[^ ]+'
  keys+='|rss_ratio=[^ ]+|fma_peak_gflops=.*'
  timeout 150 "$bin/splitserve-bench-experts" --threads "$threads" --isa "$isa" --tokens 10 \
    --calls 60 --workdir "$data" --worker "$worker" "$@" >"$f" 2>&1
  echo "bench $tag threads=$threads isa=$isa $* rc=$? $(grep -oE 'streaming read: [0-9.]+' "$f")" \
    "$(grep -oE "$keys" "$f" | tr '\n' ' ')" | tee -a "$summary"
}

# Runs "$@" (a bench call) unless SS_AB_DEADLINE seconds have passed since $start.
in_time() {
  if [ $(($(date +%s) - start)) -ge "${SS_AB_DEADLINE:-480}" ]; then
    echo "deadline: not run: $*" | tee -a "$summary"
    return 1
  fi
  "$@"
}

for part in "$@"; do
  case "$part" in
    decode16)
      for r in 1 2 3; do for isa in avx512 avx2; do bench "$max" "$isa" "d16r$r"; done; done
      ;;
    rates)
      for t in expert_kernels_test act_quant_test; do
        "$bin/$t" >"$out/experts/$t.txt" 2>&1
        echo "$t rc=$? $(tail -1 "$out/experts/$t.txt")" | tee -a "$summary"
      done
      timeout 200 "$bin/cpu_rates_bench" --threads 1,2,4,8,16 --gib 2 --passes 2 \
        >"$out/experts/rates.txt" 2>&1
      grep -E 'section=(fma|l2|l2rows) |variant=t0_16k pages=thp|section=dram.*pages=thp' \
        "$out/experts/rates.txt" | cut -c1-120 | sed 's/^/rates /' | tee -a "$summary"
      ;;
    scaling)
      start=$(date +%s)
      for r in $(seq 1 "${SCALE_ROUNDS:-1}"); do for t in ${SCALE_THREADS:-1 2 4 8}; do
        for isa in ${SCALE_ISAS:-avx512 avx2}; do
          in_time bench "$t" "$isa" "scale_r$r" || break 3
        done
      done; done
      ;;
    ggml)
      GGML_TAR="$bin/ggml.tar.xz" SS_BIN="$bin" OUT=/tmp/ss-ggml-compare THREADS="4 8 16" \
        REPEATS=1 TOKENS=8 GGML_TOKENS=15 SS_DATA="$data" timeout 560 \
        bash bench/ggml_moe/ggml_compare.sh >"$out/experts/ggml_compare.txt" 2>&1
      echo "ggml_compare rc=$?" | tee -a "$summary"
      cp /tmp/ss-ggml-compare/table.txt "$out/experts-ggml-table.txt" 2>/dev/null
      cat "$out/experts-ggml-table.txt" 2>/dev/null
      ;;
    amx)
      for t in expert_kernels_test act_quant_test; do
        "$bin/$t" >"$out/experts/amx_$t.txt" 2>&1
        echo "$t rc=$? $(grep -E 'DetectIsa|^\[  (PASSED|FAILED)' "$out/experts/amx_$t.txt" |
          tr '\n' ' ')" | tee -a "$summary"
      done
      timeout 200 "$bin/cpu_rates_bench" --threads 1,"$max" --sections fma,l2rows \
        --isa avx2,avx512,amx --rows 8,16,64 --passes 2 >"$out/experts/amx_rates.txt" 2>&1
      grep -E 'section=(fma|l2rows) ' "$out/experts/amx_rates.txt" | sed 's/^/rates /' |
        tee -a "$summary"
      for r in 1 2; do for isa in avx512 amx; do bench "$max" "$isa" "amx$r"; done; done
      ;;
    ab)
      start=$(date +%s)
      for r in $(seq 1 "${SS_AB_ROUNDS:-5}"); do for vi in ${SS_AB:?SS_AB="NAME:ISA ..."}; do
        in_time bench "$max" "${vi##*:}" "ab_r${r}_${vi%%:*}" "$bin/worker_${vi%%:*}" || break 2
      done; done
      ;;
    passes)
      start=$(date +%s)
      for r in $(seq 1 "${SS_AB_ROUNDS:-5}"); do for isa in avx2 avx512; do for p in 2 1; do
        in_time bench "$max" "$isa" "passes_r${r}_p$p" "$bin/splitserve-expert-worker" \
          --engine_passes "$p" || break 3
      done; done; done
      ;;
    *) echo "unknown part $part (decode16, rates, scaling, ggml, amx, ab, passes)" >&2; exit 2 ;;
  esac
done

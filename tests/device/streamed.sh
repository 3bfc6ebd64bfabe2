#!/usr/bin/env bash
# The streamed-expert prefill path on the device, in one call (after tests/device/pack.sh):
#   tar xJf .devpack/devbin.tar.xz && bash tests/device/streamed.sh $OUT [PHASES]
# 1. mxfp4_moe_test (the grouped GEMM against RoutedSum), 2. splitserve-golden --backend cuda with
# every step streamed (--gpu_prefill_threshold 1) from the host's weights (with the default ring,
# and with slots of one expert: many slots) and from an expert worker's shared store, and with the
# indexer's scores in slices of a few rows (--indexer_scores_kib 4), each beside the default run, 3. bench/flash_e2e.sh with PHASES (default
# "8192,32768") on Flash-shaped dummy weights, the streamed path on (the default); with
# SS_STREAMED_VARIANTS="CHUNK:RING_MIB[:THRESHOLD[:PHASES]] ..." (e.g. "8192:1024 8192:3072
# 8192:1024:off:8192") once per variant instead, each `up` started with --max-num-batched-tokens
# CHUNK --gpu-prefill-ring-mib RING_MIB [--gpu-prefill-threshold THRESHOLD] (`off`: the CPU path,
# the baseline), over PHASES (default the argument), its prefill lines printed.
# SS_STREAMED_NO_CHECKS=1 skips 1. and 2.
set -uo pipefail
cd "$(dirname "$0")/../.."
source tests/device/env.sh
out=${1:?usage: tests/device/streamed.sh OUT [PHASES]}
phases=${2:-8192,32768}
bin=.devbin
mkdir -p "$out"
[ -n "${SS_STREAMED_NO_CHECKS:-}" ] || (
  prebuilt_library_path "$bin"
  "$bin/mxfp4_moe_test" >"$out/mxfp4_moe_test.log" 2>&1
  echo "mxfp4_moe_test rc=$? $(grep -E '^\[  (PASSED|FAILED|SKIPPED) |rms_rel|ptxVersion' "$out/mxfp4_moe_test.log" | tr '\n' ' ' | cut -c1-600)"
  m=tests/data/tiny-a
  "$bin/splitserve-golden" --backend cuda --model $m --golden $m >"$out/g_host.log" 2>&1
  echo "golden cuda (host experts): rc=$? $(tail -1 "$out/g_host.log")"
  "$bin/splitserve-golden" --backend cuda --gpu_prefill_threshold 1 --model $m --golden $m >"$out/g_streamed.log" 2>&1
  echo "golden cuda --gpu_prefill_threshold 1: rc=$? $(tail -1 "$out/g_streamed.log") | $(grep -m1 -o 'streamed prefill: [0-9]* of [0-9]* layers[^;]*' "$out/g_streamed.log")"
  diff <(grep -E '^(PASS|FAIL) ' "$out/g_host.log") <(grep -E '^(PASS|FAIL) ' "$out/g_streamed.log") | head -12
  # The indexer's scores in slices of 4 rows (a 4 KiB cap; step_workspace.h IndexerScoreRows):
  # the same selections, so the same lines as the host run.
  "$bin/splitserve-golden" --backend cuda --indexer_scores_kib 4 --model $m --golden $m >"$out/g_slices.log" 2>&1
  echo "golden cuda --indexer_scores_kib 4: rc=$? $(tail -1 "$out/g_slices.log")"
  diff <(grep -E '^(PASS|FAIL) ' "$out/g_host.log") <(grep -E '^(PASS|FAIL) ' "$out/g_slices.log") | head -12
  # Slots of one tiny expert each: 32 slots, copies running two layers ahead (PlanRing).
  "$bin/splitserve-golden" --backend cuda --gpu_prefill_threshold 1 --gpu_prefill_slot_kib 64 --model $m --golden $m >"$out/g_slots.log" 2>&1
  echo "golden cuda --gpu_prefill_threshold 1 --gpu_prefill_slot_kib 64: rc=$? $(tail -1 "$out/g_slots.log") | $(grep -m1 -o 'ring [0-9]* x [^)]*)' "$out/g_slots.log")"
  seg="ss-golden-$$"
  "$bin/splitserve-expert-worker" --model $m --layers 0-6 --slice 0/1 --shm-name "$seg" >"$out/ew.log" 2>&1 &
  ew=$!
  for _ in $(seq 1 50); do [ -e "/dev/shm/$seg" ] && break; sleep 0.2; done
  "$bin/splitserve-golden" --backend cuda --experts "0-6=shm:$seg" --gpu_prefill_threshold 1 --model $m --golden $m >"$out/g_store.log" 2>&1
  echo "golden cuda --experts shm --gpu_prefill_threshold 1: rc=$? $(tail -1 "$out/g_store.log") | $(grep -m1 -o 'streamed prefill: [0-9]* of [0-9]* layers[^;]*' "$out/g_store.log")"
  grep -m3 -i "registered\|streamed prefill: layer\|warn" "$out/g_store.log"
  kill -TERM $ew; wait $ew
)
if [ -z "${SS_STREAMED_VARIANTS:-}" ]; then
  SS_BIN=$bin bash bench/flash_e2e.sh "$out/flash" "$phases"
  grep -h "streamed prefill\|registered" "$out"/flash/up/*.log | head -6
  exit 0
fi
for v in $SS_STREAMED_VARIANTS; do
  IFS=: read -r chunk ring thr vphases <<<"$v"
  args="--max-num-batched-tokens $chunk --gpu-prefill-ring-mib $ring${thr:+ --gpu-prefill-threshold $thr}"
  tag=${chunk}_$ring${thr:+_$thr}
  # The previous `up`'s store leaves /dev/shm as it exits.
  for _ in $(seq 1 60); do ls /dev/shm | grep -q . || break; sleep 1; done
  SS_BIN=$bin SS_UP_ARGS="$args" \
    bash bench/flash_e2e.sh "$out/flash_$tag" "${vphases:-$phases}" >"$out/flash_$tag.log" 2>&1
  echo "== $args: rc=$?"
  grep -h -m1 -o "streamed prefill: [0-9]* of [0-9]* layers.*GB/s" "$out/flash_$tag"/up/*.log
  grep -E "^prefill|streamed:|per prefill|experts on the CPU" "$out/flash_$tag/summary.txt"
done

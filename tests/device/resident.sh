#!/usr/bin/env bash
# Resident routed experts (issue 27) on the device, in one call:
#   SS_PACK_DIR=.devpack/r bash tests/device/pack.sh splitserve-golden splitserve-expert-worker \
#       mxfp4_moe_test resident_experts_test cuda_backend_test golden_cuda_test  # here; carry .devpack
#   bash tests/device/resident.sh $OUT [.devpack/r]             # there
#   env: SS_RESIDENT_TESTS, the backend tests of step 3 (default "cuda_backend_test golden_cuda_test")
# 1. mxfp4_moe_test (the split of the routes and the accumulating combine among the kernels) and
# resident_experts_test (the resident path against the reference sum, before and after swaps),
# 2. splitserve-golden --backend cuda with half and all of tiny-a's 16 experts a layer resident,
# at one stage and at two (sharing the GPU), and with the other experts on an expert worker's
# shared store (its calls skip the resident choices), each beside the run without; and the
# streamed path (--gpu_prefill_threshold 1), which shares the experts' sources and workspace,
# 3. the backend's gpu tests (nothing else changed).
set -uo pipefail
cd "$(dirname "$0")/../.."
source tests/device/env.sh
out=${1:?usage: tests/device/resident.sh OUT [BIN]}
bin=${2:-.devpack/r}
mkdir -p "$out"
prebuilt_library_path "$bin"
m=tests/data/tiny-a
for t in mxfp4_moe_test resident_experts_test; do
  "$bin/$t" >"$out/$t.log" 2>&1
  echo "$t rc=$? $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$out/$t.log" | tr '\n' ' ')"
  grep -A3 "FAILED\b" "$out/$t.log" | head -20
done
golden() {  # TAG ARGS...
  local tag=$1
  shift
  timeout 300 "$bin/splitserve-golden" --backend cuda --model $m --golden $m "$@" >"$out/g_$tag.log" 2>&1
  echo "golden $tag ($*): rc=$? $(tail -1 "$out/g_$tag.log") | $(grep -m1 -o 'resident experts: [^,]*([^)]*)' "$out/g_$tag.log") | $(grep -o 'resident experts: [0-9]* of [0-9]* routed choices[^(]*([0-9.]*%)' "$out/g_$tag.log" | awk '{g+=$3; a+=$5} END {if (a) printf "%d of %d choices on the GPU, all stages", g, a}')"
  grep -E '^FAIL ' "$out/g_$tag.log" | head -5
}
golden none
golden half --gpu_experts 8
golden all --gpu_experts 16
golden half_pp2 --gpu_experts 8 --stages 2
golden none_pp2 --stages 2
golden streamed --gpu_prefill_threshold 1
golden streamed_half --gpu_prefill_threshold 1 --gpu_experts 8
diff <(grep -E '^(PASS|FAIL) ' "$out/g_none.log" | cut -c1-60) <(grep -E '^(PASS|FAIL) ' "$out/g_half.log" | cut -c1-60) | head -12
seg="ss-resident-$$"
"$bin/splitserve-expert-worker" --model $m --layers 0-6 --slice 0/1 --shm-name "$seg" >"$out/ew.log" 2>&1 &
ew=$!
for _ in $(seq 1 50); do [ -e "/dev/shm/$seg" ] && break; sleep 0.2; done
golden store_half --experts "0-6=shm:$seg" --gpu_experts 8
golden store_none --experts "0-6=shm:$seg"
golden store_streamed --experts "0-6=shm:$seg" --gpu_prefill_threshold 1
kill -TERM $ew
wait $ew
grep -E "calls|skipp|error" "$out/ew.log" | tail -3
for t in ${SS_RESIDENT_TESTS-cuda_backend_test golden_cuda_test}; do
  timeout 400 "$bin/$t" >"$out/$t.log" 2>&1
  echo "$t rc=$? $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$out/$t.log" | tr '\n' ' ')"
done

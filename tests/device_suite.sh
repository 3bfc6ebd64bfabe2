#!/usr/bin/env bash
# The GPU suite, run on the accelerator machine (the `device` tool) from the repository root with
# the Debian packages carried in .deps (../shared/device/fetch-debs.sh libbrotli-dev libbrotli1:
# cpp-httplib's pkg-config file needs brotli's):
#
#   bash tests/device_suite.sh OUT_DIR [quick|services|up|tp|tpup]
#                                    (quick: no benchmarks, no `up`; services: no layer benchmark;
#                                    up: only `splitserve up`; tp: quick's run limited to what
#                                    tensor parallelism touches, with a build of only those
#                                    targets; tpup: TP across processes only -- `splitserve up
#                                    --backend cuda` at TP 1, TP 2 and TP 2 x PP 2, and PP 2 over
#                                    gRPC and over NCCL stage links, answering one
#                                    greedy chat completion each, compared, and splitserve-golden
#                                    --tp 2 --stages 2 against TP 1, building only the binaries,
#                                    or none with SS_DEVICE_BIN=DIR naming prebuilt ones; the
#                                    default mode runs golden --tp 2 --stages 2 too)
#
# Builds everything (services included when the carried packages configure; else only the model,
# the golden runner and the GPU parts), runs every gpu-labelled test binary directly (ctest's
# gtest discovery files do not load with the device's CMake), the golden conformance run through
# the cuda backend, the GPU benchmarks and, with the services built, `splitserve up --backend cuda`
# (one and two pipeline stages on GPU 0; with two GPUs also TP 2 and TP 2 x PP 2, four worker
# processes on two GPUs) answering a chat completion. Logs go to OUT_DIR; a summary goes to
# stdout.
set -uo pipefail
source "$(dirname "$0")/device/env.sh"
# Whether two golden runs' checks (lines matching PATTERN) give the same figures, the backend's
# name aside: golden_same LABEL LOG_A LOG_B PATTERN LINES -> a summary line, then the first LINES
# lines of the difference (kept in LOG_B.diff).
golden_same() {
  diff <(grep -E "$4" "$2" | sed 's/ ([^)]*backend)//') \
       <(grep -E "$4" "$3" | sed 's/ ([^)]*backend)//') >"$3.diff"
  local drc=$?
  echo "$1: $(grep -cE "$4" "$2") lines, figures identical=$([ $drc = 0 ] && echo yes || echo no)"
  head -"$5" "$3.diff"
}
out="$1"
quick="${2:-}"
mkdir -p "$out"
ngpu=$(nvidia-smi -L | wc -l)

# `splitserve up --backend cuda ARGS` on PORT, one greedy chat completion (with logprobs), then
# stopped: up_run LABEL PORT MODEL_NAME ARGS... -> $out/up_LABEL.{log,chat.json}, a summary line.
up_run() {
  local label="$1" port="$2" name="$3"
  shift 3
  "$bin/splitserve" up --backend cuda --port "$port" --log-dir "$out/up_$label" "$@" \
    >"$out/up_$label.log" 2>&1 &
  local pid=$! ok=""
  for _ in $(seq 1 300); do
    http GET "http://127.0.0.1:$port/ready" >/dev/null 2>&1 && { ok=1; break; }
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.2
  done
  if [ -n "$ok" ]; then
    http POST "http://127.0.0.1:$port/v1/chat/completions" \
      "{\"model\":\"$name\",\"messages\":[{\"role\":\"user\",\"content\":\"Hello!\"}],\"max_tokens\":24,\"temperature\":0,\"logprobs\":true}" \
      >"$out/up_$label.chat.json"
    echo "splitserve up --backend cuda $*: $(grep -m1 'ready in' "$out/up_$label.log")"
    grep -m1 'CPUs:' "$out/up_$label.log"
    echo "  $(head -c 300 "$out/up_$label.chat.json")"
    # Throughput (a benchmark figure, printed for the record: one sequence, then 8 at once).
    if [ -x "$bin/cluster_bench" ]; then
      echo "  $(timeout 120 "$bin/cluster_bench" --port "$port" --model "$name" --concurrency 8 \
        --tokens 32 --repeat 1 2>&1 | tail -1)"
    fi
  else
    echo "splitserve up --backend cuda $*: not ready"; tail -20 "$out/up_$label.log"
    tail -5 "$out/up_$label"/gpu*.log 2>/dev/null
  fi
  kill -TERM "$pid" 2>/dev/null; wait "$pid"; echo "  up exit: $?"
}
# The greedy completions of the given labels side by side: content, token count, and whether the
# tokens and their logprobs are identical to the first label's.
compare_chats() {
  python3 - "$out" "$@" <<'PY'
import json, sys
out, labels = sys.argv[1], sys.argv[2:]
ref = None
for label in labels:
    try:
        j = json.load(open(f"{out}/up_{label}.chat.json"))
        ch = j["choices"][0]
        lp = [(t["token"], t["logprob"]) for t in (ch.get("logprobs") or {}).get("content") or []]
        text = ch["message"]["content"]
    except Exception as e:
        print(f"compare {label}: no completion ({e})"); continue
    if ref is None:
        ref = (text, lp)
    same_tokens = [t for t, _ in lp] == [t for t, _ in ref[1]]
    same_lp = lp == ref[1]
    first_diff = next((i for i, (a, b) in enumerate(zip(lp, ref[1])) if a != b), None)
    print(f"compare {label} vs {labels[0]}: {len(lp)} tokens, text equal={text == ref[0]}, "
          f"tokens equal={same_tokens}, logprobs bit-equal={same_lp}, first difference at "
          f"{first_diff}; text={text[:80]!r}")
PY
}

[ -f .deps/use-deps.sh ] && source .deps/use-deps.sh
export PKG_CONFIG_SYSROOT_DIR=/tmp/deps
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
# NCCL for the TP tests (cmake/nccl.cmake): the toolkit's, else the first nccl.h under /usr or
# /opt (PyTorch's wheels carry one), named by NCCL_ROOT.
echo "NCCL_ROOT=${NCCL_ROOT:-} NCCL_P2P_DISABLE=${NCCL_P2P_DISABLE:-} NCCL_NVLS_ENABLE=$NCCL_NVLS_ENABLE"

bin=build/bin
if [ "$quick" = tpup ]; then
  # TP across processes: the binaries (prebuilt with SS_DEVICE_BIN, else built here), then the
  # runs of the header; everything else is skipped.
  if [ -n "${SS_DEVICE_BIN:-}" ]; then
    bin="$SS_DEVICE_BIN"
    prebuilt_library_path "$bin"
    echo "prebuilt binaries in $bin: $("$bin/splitserve-gpu-worker" --help >/dev/null 2>&1; echo rc=$?)"
  else
    cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DSS_BUILD_SERVICES=ON \
      -DSS_WERROR=OFF >"$out/cfg.log" 2>&1 || { tail -15 "$out/cfg.log"; exit 1; }
    start=$(date +%s)
    cmake --build build -j"$(nproc)" --target splitserve splitserve-coordinator \
      splitserve-gpu-worker splitserve-expert-worker splitserve-golden >"$out/build.log" 2>&1
    echo "build: rc=$? in $(( $(date +%s) - start )) s"; grep -m8 -E "error|FAILED" "$out/build.log"
  fi
  m=tests/data/tiny-a
  "$bin/splitserve-golden" --backend cuda --filter model --model $m --golden $m >"$out/golden_cuda.log" 2>&1
  echo "splitserve-golden --backend cuda --filter model: rc=$? $(tail -1 "$out/golden_cuda.log")"
  if [ "$ngpu" -ge 2 ]; then
    "$bin/splitserve-golden" --backend cuda --tp 2 --stages 2 --filter model --model $m --golden $m \
      >"$out/golden_cuda_tp2_pp2.log" 2>&1
    echo "splitserve-golden --backend cuda --tp 2 --stages 2 --filter model: rc=$? $(tail -1 "$out/golden_cuda_tp2_pp2.log")"
    # The whole-model (logits) checks' figures, TP 1 x PP 1 against TP 2 x PP 2.
    golden_same "golden model checks, TP 2 x PP 2 vs TP 1" "$out/golden_cuda.log" \
      "$out/golden_cuda_tp2_pp2.log" '^(PASS|FAIL) +model' 100
    grep -E '^(PASS|FAIL) +model' "$out/golden_cuda_tp2_pp2.log" | head -8
  fi
  tok=models/tiny/tokenizer.json
  up_run tp1 18301 tiny-a --model $m --tokenizer $tok --stages 1
  if [ "$ngpu" -ge 2 ]; then
    up_run tp2 18311 tiny-a --model $m --tokenizer $tok --stages 1 --tp 2
    up_run tp2pp2 18321 tiny-a --model $m --tokenizer $tok --stages 2 --tp 2
    # Streams between stages over gRPC and over NCCL links (--stage-transport auto takes them
    # where every worker has a GPU of its own).
    up_run pp2 18331 tiny-a --model $m --tokenizer $tok --stages 2 --stage-transport grpc
    up_run pp2nccl 18341 tiny-a --model $m --tokenizer $tok --stages 2
    compare_chats tp1 tp2 tp2pp2 pp2 pp2nccl
  fi
  exit 0
fi

services=ON
tests=(cuda_kernels_test block_kernels_test fused_launches_test compressor_test indexer_test
       indexer_topk_test
       output_projection_test lm_head_test paged_kv_test cuda_backend_test cuda_tp_test
       golden_cuda_test)
if [ -n "${SS_DEVICE_BIN:-}" ]; then
  # Prebuilt binaries (every test, the benchmark and the services) in SS_DEVICE_BIN with their
  # shared libraries in SS_DEVICE_BIN/lib: nothing is built here.
  bin="$SS_DEVICE_BIN"
  prebuilt_library_path "$bin"
  [ -x "$bin/splitserve" ] || services=OFF
  echo "prebuilt binaries in $bin (services=$services)"
else
if ! cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DSS_BUILD_SERVICES=ON \
    -DSS_WERROR=OFF >"$out/cfg.log" 2>&1; then
  echo "configure with services failed (tail of cfg.log):"; tail -15 "$out/cfg.log"
  services=OFF
  rm -rf build
  cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DSS_BUILD_SERVICES=OFF \
    -DSS_WERROR=OFF >"$out/cfg_noservices.log" 2>&1 || { tail -20 "$out/cfg_noservices.log"; exit 1; }
fi
grep -h "splitserve: .*NCCL" "$out"/cfg*.log
targets=()
if [ "$quick" = tp ]; then
  tests=(cuda_kernels_test block_kernels_test cuda_backend_test cuda_tp_test golden_cuda_test)
  targets=(--target "${tests[@]}" splitserve-golden)
  [ "$services" = ON ] && targets+=(splitserve-expert-worker)
fi
start=$(date +%s)
cmake --build build -j"$(nproc)" "${targets[@]}" -- -k 0 >"$out/build.log" 2>&1
echo "build (services=$services): rc=$? in $(( $(date +%s) - start )) s"
grep -m8 -E "error|FAILED" "$out/build.log"
fi  # not prebuilt

if [ "$quick" != up ]; then
for t in "${tests[@]}"; do
  [ -x "$bin/$t" ] || { echo "$t: not built"; continue; }
  "$bin/$t" >"$out/$t.log" 2>&1
  echo "$t rc=$? $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$out/$t.log" | tr '\n' ' ')"
done
# TP = 2 again as PCIe GPUs without peer-to-peer run it (NCCL through host memory).
if [ -x "$bin/cuda_tp_test" ]; then
  NCCL_P2P_DISABLE=1 "$bin/cuda_tp_test" --gtest_filter='TpTest.Coll*:TpTest.Whole*:TpTest.TwoStages*' \
    >"$out/cuda_tp_test_p2p_disabled.log" 2>&1
  echo "cuda_tp_test (NCCL_P2P_DISABLE=1) rc=$? $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$out/cuda_tp_test_p2p_disabled.log" | tr '\n' ' ')"
fi
echo "ptxVersion values: $(grep -ho 'ptxVersion=[0-9]*' "$out"/*.log | sort | uniq -c | tr '\n' ' ')"

"$bin/splitserve-golden" --backend cuda --model tests/data/tiny-a --golden tests/data/tiny-a \
  >"$out/golden_cuda.log" 2>&1
echo "splitserve-golden --backend cuda (experts on the host): rc=$? $(tail -1 "$out/golden_cuda.log")"
# The reference's double sums in fp32 (what --fp64_sums auto picks on an RTX 3090), every check's
# figures against the default run's (double on data-centre GPUs).
"$bin/splitserve-golden" --backend cuda --fp64_sums off --model tests/data/tiny-a \
  --golden tests/data/tiny-a >"$out/golden_cuda_fp32.log" 2>&1
echo "splitserve-golden --backend cuda --fp64_sums off: rc=$? $(tail -1 "$out/golden_cuda_fp32.log")"
golden_same "golden checks, --fp64_sums off vs the default" "$out/golden_cuda.log" \
  "$out/golden_cuda_fp32.log" '^(PASS|FAIL) ' 20
# Every step's routed experts streamed to the GPU (the grouped MXFP4 GEMM) instead of the host.
"$bin/splitserve-golden" --backend cuda --gpu_prefill_threshold 1 --model tests/data/tiny-a \
  --golden tests/data/tiny-a >"$out/golden_cuda_streamed.log" 2>&1
echo "splitserve-golden --backend cuda --gpu_prefill_threshold 1 (experts streamed): rc=$? $(tail -1 "$out/golden_cuda_streamed.log")"
golden_same "golden checks, streamed experts vs the host's" "$out/golden_cuda.log" \
  "$out/golden_cuda_streamed.log" '^(PASS|FAIL) ' 20
if [ "$ngpu" -ge 2 ]; then
  "$bin/splitserve-golden" --backend cuda --tp 2 --model tests/data/tiny-a \
    --golden tests/data/tiny-a >"$out/golden_cuda_tp2.log" 2>&1
  echo "splitserve-golden --backend cuda --tp 2 (experts on the host): rc=$? $(tail -1 "$out/golden_cuda_tp2.log")"
  # TP 2 x PP 2 (four backends on two GPUs), and its whole-model figures against TP 1's.
  "$bin/splitserve-golden" --backend cuda --tp 2 --stages 2 --model tests/data/tiny-a \
    --golden tests/data/tiny-a >"$out/golden_cuda_tp2_pp2.log" 2>&1
  echo "splitserve-golden --backend cuda --tp 2 --stages 2 (experts on the host): rc=$? $(tail -1 "$out/golden_cuda_tp2_pp2.log")"
  golden_same "golden model checks, TP 2 x PP 2 vs TP 1" "$out/golden_cuda.log" \
    "$out/golden_cuda_tp2_pp2.log" '^(PASS|FAIL) +model' 5
fi
if [ -x "$bin/splitserve-expert-worker" ]; then
  # The same with the routed experts in an expert-worker process on the device's CPU.
  seg="ss-golden-$$"
  "$bin/splitserve-expert-worker" --model tests/data/tiny-a --layers 0-6 --slice 0/1 \
    --shm-name "$seg" >"$out/golden_expert_worker.log" 2>&1 &
  ew=$!
  sleep 3
  "$bin/splitserve-golden" --backend cuda --experts "0-6=shm:$seg" --model tests/data/tiny-a \
    --golden tests/data/tiny-a >"$out/golden_cuda_experts.log" 2>&1
  echo "splitserve-golden --backend cuda --experts (expert worker): rc=$? $(tail -1 "$out/golden_cuda_experts.log")"
  "$bin/splitserve-golden" --backend cuda --experts "0-6=shm:$seg" --gpu_prefill_threshold 1 \
    --model tests/data/tiny-a --golden tests/data/tiny-a >"$out/golden_cuda_experts_streamed.log" 2>&1
  echo "splitserve-golden --backend cuda --experts --gpu_prefill_threshold 1 (streamed from the expert worker's store): rc=$? $(tail -1 "$out/golden_cuda_experts_streamed.log") $(grep -m1 -o 'streamed prefill: [0-9]* of [0-9]* layers streamable' "$out/golden_cuda_experts_streamed.log")"
  if [ "$ngpu" -ge 2 ]; then
    "$bin/splitserve-golden" --backend cuda --tp 2 --experts "0-6=shm:$seg" \
      --model tests/data/tiny-a --golden tests/data/tiny-a >"$out/golden_cuda_tp2_experts.log" 2>&1
    echo "splitserve-golden --backend cuda --tp 2 --experts (expert worker): rc=$? $(tail -1 "$out/golden_cuda_tp2_experts.log")"
  fi
  kill -TERM "$ew"; wait "$ew"
fi
fi  # not "up"
[ "$quick" = quick ] || [ "$quick" = tp ] && exit 0

[ "$quick" = "" ] && [ -x "$bin/cuda_backend_layer_bench" ] && timeout 240 "$bin/cuda_backend_layer_bench" \
  >"$out/cuda_backend_layer_bench.log" 2>&1
echo "cuda_backend_layer_bench rc=$?"; tail -20 "$out/cuda_backend_layer_bench.log" 2>/dev/null
if [ "$quick" = "" ] && [ "$ngpu" -ge 2 ] && [ -x "$bin/cuda_backend_layer_bench" ]; then
  # TP 2 on two GPUs: step time and the seconds in NCCL collectives per layer.
  timeout 240 "$bin/cuda_backend_layer_bench" --tp 2 >"$out/cuda_backend_layer_bench_tp2.log" 2>&1
  echo "cuda_backend_layer_bench --tp 2 rc=$?"
  grep -E "TP|KV pool" "$out/cuda_backend_layer_bench_tp2.log"
fi

if [ "$services" = ON ] && [ -x "$bin/splitserve" ]; then
  for stages in 1 2; do
    port=$((18000 + stages))
    "$bin/splitserve" up --backend cuda --stages "$stages" --port "$port" \
      --log-dir "$out/up$stages" >"$out/up$stages.log" 2>&1 &
    pid=$!
    ok=""
    for _ in $(seq 1 150); do
      http GET "http://127.0.0.1:$port/ready" >/dev/null 2>&1 && { ok=1; break; }
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.2
    done
    if [ -n "$ok" ]; then
      http POST "http://127.0.0.1:$port/v1/chat/completions" \
        '{"model":"tiny","messages":[{"role":"user","content":"Hello!"}],"max_tokens":24,"temperature":0}' \
        >"$out/up$stages.chat.json"
      echo "splitserve up --backend cuda --stages $stages: $(head -c 400 "$out/up$stages.chat.json")"
      http GET "http://127.0.0.1:$port/metrics" >"$out/up$stages.metrics.txt"
      echo "  metrics: $(grep -c '^splitserve:' "$out/up$stages.metrics.txt") series lines; $(grep -m1 '^splitserve:generation_tokens_total' "$out/up$stages.metrics.txt")"
    else
      echo "splitserve up --backend cuda --stages $stages: not ready"; tail -20 "$out/up$stages.log"
    fi
    kill -TERM "$pid" 2>/dev/null; wait "$pid"; echo "up exit: $?"
  done
  if [ "$ngpu" -ge 2 ]; then
    # TP across processes: TP 2 (two workers, GPUs 0 and 1) and TP 2 x PP 2 (four workers on the
    # two GPUs), greedy, against TP 1.
    up_run tp1 18301 tiny --stages 1
    up_run tp2 18311 tiny --stages 1 --tp 2
    up_run tp2pp2 18321 tiny --stages 2 --tp 2
    up_run pp2 18331 tiny --stages 2 --stage-transport grpc
    up_run pp2nccl 18341 tiny --stages 2  # auto: NCCL links, a GPU per worker
    compare_chats tp1 tp2 tp2pp2 pp2 pp2nccl
  fi
fi

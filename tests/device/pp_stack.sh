#!/usr/bin/env bash
# Run on the GPU machine from the repository root: the layer bench's pipeline mode
# (bench/pipeline_stack.h) at TP 2 x PP 2 and TP 1 x PP 2, and the stage-to-stage push bench, from
# a mini pack made here:
#   SS_PACK_DIR=.devpack/mini bash tests/device/pack.sh cuda_backend_layer_bench stage_push_bench
# then the device tool with carry [".devpack/mini"]:
#   bash tests/device/pp_stack.sh $OUT
# (or from the full pack, unpacked: SS_DEVICE_BIN=.devbin bash tests/device/pp_stack.sh $OUT)
# With fewer GPUs than TP x PP the stages share them (the bench says so). Each layout runs with the
# streams over gRPC, and TP 1 x PP 2 also over NCCL stage links (--stage-transport nccl, which
# needs a GPU per worker: TP 2 x PP 2 over NCCL needs four);
# CONFIGS="TP PP TRANSPORT;..." limits it (e.g. CONFIGS="1 2 nccl").
set -u
out=$1
export NCCL_NVLS_ENABLE=0
nccl=$(python3 -c "import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], 'lib'))" 2>/dev/null)
bin=${SS_DEVICE_BIN:-.devpack/mini}
export LD_LIBRARY_PATH=$PWD/$bin:$PWD/$bin/lib:/usr/local/cuda/lib64:${nccl}
nvidia-smi -L
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
IFS=';' read -ra configs <<< "${CONFIGS:-2 2 grpc;1 2 grpc;1 2 nccl}"
for cfg in "${configs[@]}"; do
  set -- $cfg
  [ "$1" -le "$gpus" ] || { echo "TP $1 x PP $2: skipped, $gpus GPU(s)"; continue; }
  [ "$3" = grpc ] || [ $(($1 * $2)) -le "$gpus" ] || { echo "TP $1 x PP $2 $3: skipped, $gpus GPU(s)"; continue; }
  log=$out/tp$1pp$2_$3.log
  timeout 280 $bin/cuda_backend_layer_bench --tp $1 --pp $2 --stage-transport $3 > $log 2>&1
  echo "TP $1 x PP $2 over $3: rc=$?"
  grep -v '^\[' $log
done
[ -x $bin/stage_push_bench ] && timeout 120 $bin/stage_push_bench 200

#!/usr/bin/env bash
# Run on the GPU machine from the repository root: the layer bench's pipeline mode
# (bench/pipeline_stack.h) at TP 2 x PP 2 and TP 1 x PP 2, and the stage-to-stage push bench, from
# a mini pack made here:
#   SS_PACK_DIR=.devpack/mini bash tests/device/pack.sh cuda_backend_layer_bench stage_push_bench
# then the device tool with carry [".devpack/mini"]:
#   bash tests/device/pp_stack.sh $OUT
# (or from the full pack, unpacked: SS_DEVICE_BIN=.devbin bash tests/device/pp_stack.sh $OUT)
# With fewer GPUs than TP x PP the stages share them (the bench says so).
set -u
out=$1
export NCCL_NVLS_ENABLE=0
nccl=$(python3 -c "import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], 'lib'))" 2>/dev/null)
bin=${SS_DEVICE_BIN:-.devpack/mini}
export LD_LIBRARY_PATH=$PWD/$bin:$PWD/$bin/lib:/usr/local/cuda/lib64:${nccl}
nvidia-smi -L
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
for cfg in "2 2" "1 2"; do
  set -- $cfg
  [ "$1" -le "$gpus" ] || { echo "TP $1 x PP $2: skipped, $gpus GPU(s)"; continue; }
  timeout 280 $bin/cuda_backend_layer_bench --tp $1 --pp $2 > $out/tp$1pp$2.log 2>&1
  echo "TP $1 x PP $2: rc=$?"
  grep -v '^\[' $out/tp$1pp$2.log
done
[ -x $bin/stage_push_bench ] && timeout 120 $bin/stage_push_bench 200

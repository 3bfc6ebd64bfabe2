#!/usr/bin/env bash
# Run on the GPU machine from the repository root, after tests/device/pack.sh here (see there).
# Focused device run: the cuda backend and TP tests, the layer bench (TP 1), splitserve up (TP 1,
# TP 2, TP 2 x PP 2) on the prebuilt binaries.
out=$1
export NCCL_NVLS_ENABLE=0
tar xJf .devpack/devbin.tar.xz || exit 1
nccl=$(python3 -c "import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], 'lib'))" 2>/dev/null)
export LD_LIBRARY_PATH="$PWD/.devbin:$PWD/.devbin/lib:/usr/local/cuda/lib64:${nccl}"
for t in output_projection_test cuda_backend_test cuda_tp_test golden_cuda_test; do
  timeout 90 .devbin/$t > $out/$t.log 2>&1; echo "$t rc=$?"
  grep -E "graphs vs launched|PASSED|FAILED|bit-identical|wo_a|ptxVersion" $out/$t.log | head -40
done
CUDA_VISIBLE_DEVICES=1 timeout 120 .devbin/cuda_backend_layer_bench > $out/bench.log 2>&1; echo "bench rc=$?"
grep -vE "^KV pool" $out/bench.log
SS_DEVICE_BIN=.devbin timeout 130 bash tests/device_suite.sh $out/up tpup > $out/up.txt 2>&1; echo "up rc=$?"
cat $out/up.txt

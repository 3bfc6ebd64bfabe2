#!/usr/bin/env bash
# Run on the GPU machine from the repository root, after tests/device/pack.sh here (see there).
# ncu sections of a few kernels in the bench's --profile steps (GPU 0).
out=$1
export NCCL_NVLS_ENABLE=0
tar xJf .devpack/devbin.tar.xz || exit 1
nccl=$(python3 -c "import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], 'lib'))" 2>/dev/null)
export LD_LIBRARY_PATH="$PWD/.devbin:$PWD/.devbin/lib:/usr/local/cuda/lib64:${nccl}"
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
CUDA_VISIBLE_DEVICES=0 timeout 240 "$NCU" --profile-from-start off \
  --kernel-name regex:"GroupedOutProj|HcFinish|TopK|Fp8Gemv" --launch-count 8 \
  --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
  --section MemoryWorkloadAnalysis \
  .devbin/cuda_backend_layer_bench /tmp/ssb0 --profile > $out/ncu.txt 2> $out/ncu.err
echo "ncu rc=$?"
grep -E "^  [A-Za-z].*\(|Duration|Memory Throughput|DRAM Throughput|Achieved Occupancy|Theoretical Occupancy|Registers Per|Block Limit|Grid Size|Waves Per SM|Stall|Compute \(SM\)|L2 Hit|Warp Cycles Per Issued" $out/ncu.txt | head -150

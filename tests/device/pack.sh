#!/usr/bin/env bash
# Packs the prebuilt device binaries (build/bin, built on the dev machine) and the Debian shared
# libraries they need into .devpack/devbin.tar.xz (git-ignored), so the GPU machine builds nothing:
#   bash tests/device/pack.sh            # here, after cmake --build build
# then the `device` tool with carry [".devpack"] runs, from the repository root, e.g.
#   tar xJf .devpack/devbin.tar.xz && SS_DEVICE_BIN=.devbin bash tests/device_suite.sh $OUT/logs [quick]
#   bash tests/device/focus.sh $OUT      # backend, TP and golden tests, the layer bench, `up`
#   bash tests/device/ncu_kernels.sh $OUT   # ncu sections of the slowest decode kernels
#   bash tests/device/profile.sh $OUT    # ncu per-kernel times (GPU 0) beside the bench (GPU 1)
#   bash tests/device/experts.sh $OUT decode16   # the CPU expert worker's issue-30 figures (see there)
# A few binaries from another build tree into a folder of their own (carry that folder; it holds
# bin/ with lib/ beside the binaries, unpacked, so no tar step is needed there):
#   SS_PACK_BUILD=build-x SS_PACK_DIR=build-x/devmini bash tests/device/pack.sh indexer_test ...
set -euo pipefail
cd "$(dirname "$0")/../.."
# The non-system shared libraries of every file in $1 into $1/lib, then everything stripped (the
# device tool carries at most 64 MiB, the tracked tree included).
pack_libs() {
  for b in "$1"/*; do
    [ -f "$b" ] || continue
    ldd "$b" 2>/dev/null | awk '/=> \//{print $3}' | while read -r l; do
      case "$(basename "$l")" in
        libc.so*|libm.so*|libpthread*|libdl*|librt*|ld-linux*|libstdc++*|libgcc_s*|libcuda.so*|libnccl*|libcudart*|libcublas*) ;;
        *) cp -Ln "$l" "$1/lib/" ;;
      esac
    done
  done
  strip --strip-unneeded "$1"/* "$1"/lib/* 2>/dev/null || true
}
if [ -n "${SS_PACK_DIR:-}" ]; then
  build=${SS_PACK_BUILD:-build}
  rm -rf "$SS_PACK_DIR" && mkdir -p "$SS_PACK_DIR/lib"
  for b in "$@"; do cp "$build/bin/$b" "$SS_PACK_DIR/"; done
  pack_libs "$SS_PACK_DIR"
  du -sh "$SS_PACK_DIR"
  echo "on the device: export LD_LIBRARY_PATH=\$PWD/$SS_PACK_DIR/lib:/usr/local/cuda/lib64; $SS_PACK_DIR/<binary>"
  exit 0
fi
mkdir -p .devpack
rm -rf .devbin && mkdir -p .devbin/lib
bins=(cuda_kernels_test block_kernels_test fused_launches_test compressor_test indexer_test
      indexer_topk_test
      output_projection_test lm_head_test paged_kv_test cuda_backend_kv_test cuda_backend_test cuda_tp_test
      golden_cuda_test cuda_backend_layer_bench gpu_kernels_bench splitserve splitserve-golden
      splitserve-expert-worker splitserve-gpu-worker splitserve-coordinator make_checkpoint
      cluster_bench stage_push_bench splitserve-bench-experts cpu_rates_bench expert_kernels_test
      act_quant_test
      dummy_weights_bench mxfp4_moe_test
      mxfp4_moe_bench)
for b in "${bins[@]}"; do [ -x build/bin/$b ] && cp build/bin/$b .devbin/; done
cp -L /usr/local/cuda/lib64/libcudart.so.13 .devbin/ 2>/dev/null || true
pack_libs .devbin

XZ_OPT=-9 tar cJf .devpack/devbin.tar.xz .devbin -C build share
ls -la .devpack/devbin.tar.xz

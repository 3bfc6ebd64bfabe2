#!/usr/bin/env bash
# The SIMD expert kernels' per-row helpers stay inside their tile loops (GCC only).
#   kernel_inlining_test.sh LIBSS_EXPERT_KERNELS.a CXX_COMPILER_ID
#
# The decode and multi-row loops call small helpers per weight row and chunk (ChunkOne,
# ReduceRows, DotPlanes, GroupScales, Store, ...). GCC decides per translation unit whether to
# inline them. When it puts them out of line, the AVX2 tile loop turns into calls and spills, and
# decode at 16 threads falls by a quarter (bench/RESULTS.md, session 39: a build with more
# template instantiations in isa_driver.h). Nothing else would notice, since the bits are the
# same. This test lists the functions each ISA object defines out of line and fails on any
# outside the allowed set below: the entry points, one call's preparation, and the tile loops
# themselves.
#
# If it fails after a change to cpu_expert_worker/kernels/: look at `nm -C` of the object it
# names. Either make the compiler inline the helper again, or, if the new function really runs
# once a tile or once a call, add it below and say why in the commit.
set -uo pipefail
archive=${1:?usage: kernel_inlining_test.sh ARCHIVE CXX_COMPILER_ID}
compiler=${2:-}
if [ "$compiler" != "GNU" ]; then
  echo "SKIP: the inlining guard is written for GCC's code; this build uses '$compiler'"
  exit 77
fi
if ! command -v nm >/dev/null; then
  echo "SKIP: nm (binutils) is not installed"
  exit 77
fi
# Out of line by design: entry points, per-call preparation, per-tile loops.
allowed='^(Linear4[A-Za-z0-9]*|Quantize[A-Za-z0-9]*|TileOne|TileMany|TransposeScales|WidenRecords|WidenBlock|WidenChunk|DecodeWeights|RowBlock)$'
all=$(nm -C -A "$archive") || { echo "FAIL: nm could not read $archive"; exit 1; }
fail=0
checked=0
for obj in expert_avx2.cc.o expert_avx512.cc.o expert_amx.cc.o quantize_avx2.cc.o \
  quantize_avx512.cc.o; do
  syms=$(printf '%s\n' "$all" | grep -F ":$obj:" | sed "s|^.*:$obj:||")
  [ -n "$syms" ] || continue  # not built for this target
  checked=$((checked + 1))
  # Defined text symbols -> the function's bare name (namespaces and "void " stripped).
  names=$(printf '%s\n' "$syms" | sed -nE 's/^[0-9a-f]+ [tT] //p' |
    sed -E 's/ss::expert::internal:://g; s/\(anonymous namespace\):://g; s/^void //' |
    sed -E 's/^([A-Za-z0-9_]+).*/\1/' | sort -u)
  for n in $names; do
    if ! [[ $n =~ $allowed ]]; then
      echo "FAIL: $obj defines '$n' out of line (a per-row helper?); see this script's header"
      fail=1
    fi
  done
  if [ "$obj" = expert_avx2.cc.o ] && ! grep -qx TileOne <<<"$names"; then
    echo "FAIL: $obj defines no TileOne: the kernel layout changed, update this test"
    fail=1
  fi
done
if [ "$checked" -eq 0 ]; then
  echo "FAIL: no ISA kernel object found in $archive"
  exit 1
fi
[ "$fail" -eq 0 ] && echo "OK: $checked ISA objects, only the allowed functions out of line"
exit "$fail"

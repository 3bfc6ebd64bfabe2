#!/usr/bin/env bash
# pack_ggml.sh SRC_GIT_DIR OUT.tar.xz: a minimal source archive of ggml for a CPU-only static build
# (the top-level CMake files, cmake/, include/, src/'s own files and src/ggml-cpu/; no other
# backend, no tests or examples), for bench/ggml_moe/ggml_compare.sh on a host without network.
# SRC_GIT_DIR is a ggml git directory (bare or a checkout); REV (env, default HEAD) picks the
# commit. The archive holds one folder, ggml/, with GGML_COMMIT (the full commit id) beside the
# sources. After packing, the archive is unpacked into a temporary folder and configured (CMake
# only, no compile) to check that it is complete; CHECK_BUILD=1 compiles it too.
#
#   bench/ggml_moe/pack_ggml.sh /work/.mirror/ggml-org+ggml/repo /tmp/ggml-src.tar.xz
set -euo pipefail

if [ $# -ne 2 ]; then
  echo "usage: $0 SRC_GIT_DIR OUT.tar.xz" >&2
  exit 2
fi
src="$1"
out="$(realpath -m "$2")"
rev="${REV:-HEAD}"
commit="$(git -C "$src" rev-parse --verify "${rev}^{commit}")"

# src/'s own files (not its backend folders) plus the CPU backend.
mapfile -t src_files < <(git -C "$src" ls-tree --name-only "$commit" src/ |
  while read -r p; do
    [ "$(git -C "$src" cat-file -t "$commit:$p")" = blob ] && echo "$p"
  done)
paths=(CMakeLists.txt LICENSE ggml.pc.in cmake include "${src_files[@]}" src/ggml-cpu)

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
mkdir "$tmp/ggml"
git -C "$src" archive --format=tar "$commit" -- "${paths[@]}" | tar -x -C "$tmp/ggml"
echo "$commit" >"$tmp/ggml/GGML_COMMIT"
mkdir -p "$(dirname "$out")"
tar -C "$tmp" -cf - ggml | xz -9 -T0 >"$out"

# The check: unpack and configure (and compile with CHECK_BUILD=1) from the archive alone.
mkdir "$tmp/check"
tar -xJf "$out" -C "$tmp/check"
cmake -S "$tmp/check/ggml" -B "$tmp/check/build" -DCMAKE_BUILD_TYPE=Release \
  -DBUILD_SHARED_LIBS=OFF -DGGML_NATIVE=OFF -DGGML_BUILD_TESTS=OFF -DGGML_BUILD_EXAMPLES=OFF \
  >"$tmp/check/configure.log" 2>&1 || {
  cat "$tmp/check/configure.log" >&2
  echo "pack_ggml: the archive does not configure" >&2
  exit 1
}
if [ "${CHECK_BUILD:-0}" = 1 ]; then
  cmake --build "$tmp/check/build" -j "$(nproc)" >"$tmp/check/build.log" 2>&1 || {
    tail -50 "$tmp/check/build.log" >&2
    echo "pack_ggml: the archive does not build" >&2
    exit 1
  }
fi
echo "pack_ggml: $out, ggml $commit, $(stat -c %s "$out") bytes"

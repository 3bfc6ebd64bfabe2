#!/usr/bin/env bash
# clang-format --dry-run --Werror (the repository's .clang-format) over the C, C++ and CUDA files
# (.h .cc .cu .cuh) changed since the commit named in .ci/format-base: committed since it,
# modified or untracked (not ignored) now. Exit 0 when they are all formatted; 1, with
# clang-format's diagnostics and the files' names, when one is not; 2 when clang-format is missing.
# Skipped (exit 0, with a message) where this is not a git checkout or the base commit is not in
# it (a shallow clone).
#
#   tools/check_format.sh          (CLANG_FORMAT=path picks another clang-format)
set -euo pipefail
cd "$(dirname "$0")/.."
clang_format="${CLANG_FORMAT:-clang-format}"
exts=('*.h' '*.cc' '*.cu' '*.cuh')

if ! command -v git >/dev/null 2>&1 || ! git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  echo "check_format: not a git checkout; skipped"
  exit 0
fi
base="$(tr -d '[:space:]' < .ci/format-base)"
if ! git cat-file -e "${base}^{commit}" 2>/dev/null; then
  echo "check_format: the base commit ${base} (.ci/format-base) is not in this clone; skipped"
  exit 0
fi
if ! command -v "$clang_format" >/dev/null 2>&1; then
  echo "check_format: ${clang_format} not found (deploy/install-deps.sh installs clang-format)" >&2
  exit 2
fi

mapfile -t files < <({
  git diff --name-only --diff-filter=d "$base" -- "${exts[@]}"
  git ls-files --others --exclude-standard -- "${exts[@]}"
} | sort -u)
bad=()
for f in "${files[@]}"; do
  "$clang_format" --dry-run --Werror "$f" || bad+=("$f")
done
if [ ${#bad[@]} -ne 0 ]; then
  echo "check_format: ${#bad[@]} of ${#files[@]} file(s) changed since ${base:0:12} are not" \
    "clang-format clean; run: clang-format -i ${bad[*]}"
  exit 1
fi
echo "check_format: ${#files[@]} file(s) changed since ${base:0:12}, all clang-format clean"

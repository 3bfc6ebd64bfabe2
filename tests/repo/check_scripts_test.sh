#!/usr/bin/env bash
# The repository checks that deploy/test.sh runs before the build:
#  * tools/check_layering.py passes on this repository, and on a small fake tree names each
#    include a folder may not make (file:line, the header, the rule) and exits 1;
#  * tools/check_format.sh, in a fake git repository, fails on an unformatted file changed since
#    .ci/format-base (committed or not) and passes once it is formatted; outside a git checkout it
#    skips. That part exits 77 (skipped) without clang-format or git.
#
#   check_scripts_test.sh REPO_ROOT
#
# Works in a fresh directory under $TMPDIR (outside any git checkout, which the format part needs),
# removed at exit.
set -euo pipefail
repo="$(cd "$1" && pwd)"
work="$(mktemp -d "${TMPDIR:-/tmp}/check_scripts_test.XXXXXX")"
trap 'rm -rf "$work"' EXIT
fail() {
  echo "FAIL: $*"
  exit 1
}

# --- layering: the repository itself
python3 "$repo/tools/check_layering.py" --root "$repo" || fail "the repository breaks its layering"

# --- layering: a fake tree
t="$work/layer"
mkdir -p "$t"/{common,proto,coordinator,gpu_worker/kernels,gpu_worker/cuda,cpu_expert_worker/transport,tests,newdir}
put() { mkdir -p "$(dirname "$t/$1")" && printf '%s\n' "${@:2}" > "$t/$1"; }
put common/a.h '#pragma once' '#include "absl/status/status.h"' '#include "common/b.h"'
put common/b.h '#pragma once' '#include "gpu_worker/backend.h"'
put gpu_worker/backend.h '#pragma once' '#include "proto/x.pb.h"'
put gpu_worker/client.cc '#include "cpu_expert_worker/transport/shm_client.h"' \
  '#include "cpu_expert_worker/transport/shm_server.h"'
put gpu_worker/cuda/step.cc '#include "gpu_worker/kernels/k.h"' '#include "gpu_worker/backend.h"'
put gpu_worker/kernels/k.h '#pragma once' '#include "common/a.h"'
put gpu_worker/kernels/k.cu '#include "k.h"' '#include <gpu_worker/backend.h>'
put cpu_expert_worker/transport/shm_client.h '#pragma once'
put cpu_expert_worker/transport/shm_server.h '#pragma once'
put coordinator/main.cc '#include "coordinator/x.h"' '  #  include "cpu_expert_worker/transport/shm_client.h"'
put tests/t.cc '#include "gpu_worker/kernels/k.h"' '#include "coordinator/main.cc"'
put newdir/x.cc '#include "common/a.h"'
put build/ignored.cc '#include "coordinator/x.h"'
rc=0
python3 "$repo/tools/check_layering.py" --root "$t" > "$work/layer.out" || rc=$?
cat "$work/layer.out"
[ "$rc" -eq 1 ] || fail "check_layering exited $rc on the fake tree, expected 1"
expected=(
  'common/b.h:2: includes "gpu_worker/backend.h": common/ may include only common/'
  'coordinator/main.cc:2: includes "cpu_expert_worker/transport/shm_client.h": coordinator/ may include only coordinator/, common/, proto/'
  'gpu_worker/client.cc:2: includes "cpu_expert_worker/transport/shm_server.h": gpu_worker/ may include only gpu_worker/, common/, proto/, cpu_expert_worker/transport/grpc_client.h, cpu_expert_worker/transport/shm_client.h'
  'gpu_worker/kernels/k.cu:2: includes "gpu_worker/backend.h": gpu_worker/kernels/ may include only gpu_worker/kernels/, common/'
  'newdir/x.cc: no layering rule for its folder (tools/check_layering.py RULES)'
)
for e in "${expected[@]}"; do
  grep -qxF "$e" "$work/layer.out" || fail "missing: $e"
done
[ "$(grep -c ': includes \|: no layering rule' "$work/layer.out")" -eq ${#expected[@]} ] ||
  fail "check_layering reported more than the ${#expected[@]} expected lines"

# --- format
if ! command -v git >/dev/null 2>&1 || ! command -v "${CLANG_FORMAT:-clang-format}" >/dev/null 2>&1; then
  echo "[  SKIPPED ] check_format.sh: git or clang-format missing (deploy/install-deps.sh)"
  exit 77
fi
f="$work/format"
mkdir -p "$f/tools" "$f/.ci" "$f/src"
cp "$repo/tools/check_format.sh" "$f/tools/"
cp "$repo/.clang-format" "$f/"
printf 'int  unformatted_before_base ;\n' > "$f/src/old.cc"  # not changed since the base: not checked
(cd "$f" && printf 'ignored.cc\n' > .gitignore && printf 'int   x ;\n' > ignored.cc)
git -C "$f" init -q
git -C "$f" add -A
git -C "$f" -c user.name=t -c user.email=t@t commit -q -m base
git -C "$f" rev-parse HEAD > "$f/.ci/format-base"
"$f/tools/check_format.sh" || fail "check_format failed with nothing changed since the base"
printf 'int  y ;\n' > "$f/src/new.cu"  # untracked
rc=0
"$f/tools/check_format.sh" > "$work/format.out" 2>&1 || rc=$?
cat "$work/format.out"
[ "$rc" -eq 1 ] || fail "check_format exited $rc on an unformatted untracked file, expected 1"
grep -q 'src/new.cu' "$work/format.out" || fail "check_format did not name src/new.cu"
grep -q 'old.cc\|ignored.cc' "$work/format.out" && fail "check_format checked unchanged or ignored files"
printf 'int y;\n' > "$f/src/new.cu"
git -C "$f" add -A
git -C "$f" -c user.name=t -c user.email=t@t commit -q -m formatted
printf 'int  z ;\n' > "$f/src/committed.h"
git -C "$f" add -A
git -C "$f" -c user.name=t -c user.email=t@t commit -q -m unformatted
rc=0
"$f/tools/check_format.sh" > "$work/format.out" 2>&1 || rc=$?
[ "$rc" -eq 1 ] && grep -q 'src/committed.h' "$work/format.out" ||
  fail "check_format passed a committed unformatted file (rc $rc)"
printf 'int z;\n' > "$f/src/committed.h"  # fixed but not committed: the working tree counts
"$f/tools/check_format.sh" || fail "check_format failed once every changed file was formatted"
rm -rf "$f/.git"
"$f/tools/check_format.sh" | grep -q 'not a git checkout; skipped' || fail "no skip outside git"
echo "check_scripts_test: passed"

#!/usr/bin/env bash
# The systemd units of deploy/systemd, checked offline by systemd's own tools (no systemd as PID 1
# needed, no root, nothing installed):
#  * `systemd-analyze verify` loads each unit without a warning (an unknown or misspelt directive,
#    a value it cannot parse, a bad specifier). verify wants ExecStart's binary to exist, so each
#    unit is checked as a copy whose ExecStart runs /bin/true with the same arguments; a template
#    is checked as the instance "@x". That verify would report a broken unit is checked too, on a
#    copy with an unknown key.
#  * `systemd-analyze security --offline=true --threshold=N` scores each unit's exposure at most
#    the level the unit reaches (deploy/README.md "Hardening"), in tenths: a unit that loses a
#    hardening directive fails. The levels are systemd 252's (Debian 12); another version weighs
#    the directives differently and may score otherwise.
#
#   systemd_units_test.sh REPO_ROOT
#
# Exits 77 (skipped) without systemd-analyze, or with one older than 252 (no --offline).
set -euo pipefail
repo="$(cd "$1" && pwd)"
units="$repo/deploy/systemd"
fail() {
  echo "FAIL: $*"
  exit 1
}
if ! command -v systemd-analyze >/dev/null 2>&1; then
  echo "systemd-analyze not found (Debian: apt-get install systemd): skipped"
  exit 77
fi
if ! systemd-analyze security --help 2>&1 | grep -q -- '--offline'; then
  echo "systemd-analyze $(systemd-analyze --version | head -1) has no --offline: skipped"
  exit 77
fi
work="$(mktemp -d "${TMPDIR:-/tmp}/systemd_units_test.XXXXXX")"
trap 'rm -rf "$work"' EXIT

# Highest exposure allowed per unit, in tenths (systemd-analyze's --threshold scale).
declare -A max_exposure=(
  [splitserve-coordinator.service]=11
  [splitserve-expert-worker@.service]=14
  [splitserve-gpu-worker@.service]=16
)
[ "${max_exposure[splitserve-coordinator.service]}" -lt 40 ] || fail "the coordinator must stay below 4"

checked=0
for path in "$units"/*.service; do
  unit="$(basename "$path")"
  [ -n "${max_exposure[$unit]:-}" ] || fail "$unit has no exposure level in this test"
  copy="$work/${unit/@./@x.}"
  sed -E 's#^ExecStart=/usr/local/bin/[^ ]+#ExecStart=/bin/true#' "$path" >"$copy"
  grep -q '^ExecStart=/bin/true' "$copy" || fail "$unit: no ExecStart=/usr/local/bin/... to check"

  out="$(cd "$work" && systemd-analyze verify --man=no "./$(basename "$copy")" 2>&1)" ||
    fail "$unit: systemd-analyze verify failed: $out"
  [ -z "$out" ] || fail "$unit: systemd-analyze verify warns: $out"

  max="${max_exposure[$unit]}"
  report="$(cd "$work" && systemd-analyze security --offline=true --threshold="$max" --no-pager \
    "./$(basename "$copy")" 2>&1)" && rc=0 || rc=$?
  level="$(printf '%s\n' "$report" | sed -nE 's/.*Overall exposure level for [^:]+: ([0-9]+\.[0-9]).*/\1/p')"
  [ -n "$level" ] || fail "$unit: no overall exposure level in: $report"
  tenths="${level/./}"
  tenths="$((10#$tenths))"
  if [ "$rc" -ne 0 ] || [ "$tenths" -gt "$max" ]; then
    printf '%s\n' "$report" | grep -F '✗' || true
    fail "$unit: exposure $level, allowed at most $((max / 10)).$((max % 10)) (rc $rc)"
  fi
  echo "$unit: verify clean, exposure $level (at most $((max / 10)).$((max % 10)))"
  checked=$((checked + 1))
done
[ "$checked" -eq "${#max_exposure[@]}" ] || fail "checked $checked units, expected ${#max_exposure[@]}"

# The verify check can fail: an unknown key is reported.
bad="$work/splitserve-broken.service"
sed 's/^UMask=/NoSuchDirective=1\nUMask=/' "$work/splitserve-coordinator.service" >"$bad"
out="$(cd "$work" && systemd-analyze verify --man=no ./splitserve-broken.service 2>&1)" || true
printf '%s\n' "$out" | grep -q 'NoSuchDirective' || fail "verify did not report an unknown key: $out"
echo "PASS: $checked units"

#!/usr/bin/env bash
# ggml_compare.sh: splitserve's CPU expert worker side by side with ggml's CPU backend on the same
# MXFP4 MoE decode (DeepSeek-V4-Flash routed experts: dim 4096, inter 2048, E experts, top-6), in
# one run on one host.
#
# Builds ggml twice from source (CMake, Release, static, CPU backend only, GGML_NATIVE=OFF; tests
# and examples off; OpenMP as ggml's default finds it): "avx512" = AVX/AVX2/FMA/F16C/BMI2 + AVX512
# (F/CD/VL/DQ/BW) + AVX512_VNNI + AVX512_VBMI + AVX512_BF16, "avx2" = AVX/AVX2/FMA/F16C/BMI2 only.
# Links bench/ggml_moe/ggml_moe_decode.cc against each (g++ -O3, no -march: the libraries carry the
# ISA). Then per thread count N and build, REPEATS times, interleaved:
#   splitserve-bench-experts --stream_only --threads N         (the streaming-read baseline)
#   taskset -c CPUS ggml_moe_decode --threads N ...            (per ggml weights mode)
#   splitserve-bench-experts --threads N --isa BUILD --tokens TOKENS --layers LAYERS ...
# CPUS are the first N physical cores of node 0 (one hardware thread each, the lowest): the cores
# splitserve's bench pins its worker to (it does so itself; a mismatch is reported). Prints a table
# per (build, threads): decode GB/s of each and their ratio, the stream GB/s, tokens/s; every run's
# figures and the median. Everything raw lands under $OUT (host.txt, logs/, raw/, runs.tsv,
# table.txt).
#
# Resumable: a run whose raw file holds its result from the same configuration (sizes, tokens,
# ggml commit, checksums of the three binaries) is reused, and the ggml builds are kept, so an
# interrupted run (a device's per-command limit) continues where it stopped when started again with
# the same OUT. RESUME=0 redoes everything.
#
# Environment:
#   GGML_TAR     ggml source archive from bench/ggml_moe/pack_ggml.sh, or
#   GGML_SRC     a ggml source folder (one of the two)
#   SS_BIN       folder with splitserve-bench-experts and splitserve-expert-worker (required)
#   OUT          output folder (required)
#   THREADS      thread counts, default "4 8 16"
#   BUILDS       "avx512 avx2" (default); a build this CPU cannot run is skipped
#   REPEATS      runs per (threads, build) and engine, default 3
#   TOKENS       splitserve's decode tokens per run, default 12 (each follows a 1 GiB read pass)
#   GGML_TOKENS  ggml's timed tokens per run (after 3 warm-up tokens), default 30
#   LAYERS       layers for both, default 43;  EXPERTS: experts per layer for both, default 16
#   GGML_REPACK  ggml weights modes: "1" = llama.cpp's default (CPU_REPACK where ggml takes MXFP4
#                mul_mat_id there), "0" = the plain CPU buffer; default "1", "1 0" runs both
#   SS_DATA      splitserve's synthetic checkpoint folder, default $OUT/ss-data (7.9 GB at 43
#                layers; written once, reused)
#   JOBS         compile jobs, default nproc
#   ESTIMATE_ONLY=1  print the time estimate and exit
#
#   GGML_TAR=ggml.tar.xz SS_BIN=build/bin OUT=/tmp/cmp bench/ggml_moe/ggml_compare.sh
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
THREADS="${THREADS:-4 8 16}"
BUILDS="${BUILDS:-avx512 avx2}"
REPEATS="${REPEATS:-3}"
TOKENS="${TOKENS:-12}"
GGML_TOKENS="${GGML_TOKENS:-30}"
LAYERS="${LAYERS:-43}"
EXPERTS="${EXPERTS:-16}"
GGML_REPACK="${GGML_REPACK:-1}"
JOBS="${JOBS:-$(nproc)}"
RESUME="${RESUME:-1}"
: "${OUT:?set OUT to the output folder}"
: "${SS_BIN:?set SS_BIN to the folder with splitserve-bench-experts}"
SS_DATA="${SS_DATA:-$OUT/ss-data}"

die() {
  echo "ggml_compare: $*" >&2
  exit 1
}

# The first N physical cores of node 0, one CPU each (its lowest hardware thread), as a taskset
# list; all online CPUs where sysfs has no node.
first_cores() {
  local n="$1" list=/sys/devices/system/node/node0/cpulist picked=() cpu sib
  [ -r "$list" ] || list=/sys/devices/system/cpu/online
  # shellcheck disable=SC2013
  for cpu in $(awk -F, '{for (i = 1; i <= NF; i++) {split($i, r, "-");
      for (c = r[1]; c <= (r[2] == "" ? r[1] : r[2]); c++) print c}}' "$list"); do
    sib="/sys/devices/system/cpu/cpu$cpu/topology/thread_siblings_list"
    if [ -r "$sib" ] && [ "$(sed 's/[-,].*//' "$sib")" != "$cpu" ]; then continue; fi
    picked+=("$cpu")
    if [ "${#picked[@]}" -eq "$n" ]; then break; fi
  done
  if [ "${#picked[@]}" -ne "$n" ]; then return 1; fi
  (
    IFS=,
    echo "${picked[*]}"
  )
}

cpu_has() {
  local f
  for f in "$@"; do grep -q -w "$f" /proc/cpuinfo || return 1; done
}

ggml_flags() {
  local common=(-DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF -DGGML_NATIVE=OFF
    -DGGML_BACKEND_DL=OFF -DGGML_BUILD_TESTS=OFF -DGGML_BUILD_EXAMPLES=OFF
    -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON -DGGML_AVX_VNNI=OFF)
  case "$1" in
    avx2) echo "${common[*]} -DGGML_AVX512=OFF -DGGML_AVX512_VNNI=OFF -DGGML_AVX512_VBMI=OFF" \
      "-DGGML_AVX512_BF16=OFF" ;;
    avx512) echo "${common[*]} -DGGML_AVX512=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_VBMI=ON" \
      "-DGGML_AVX512_BF16=ON" ;;
    *) die "unknown build $1 (avx512 or avx2)" ;;
  esac
}

build_runs_here() {
  case "$1" in
    avx2) cpu_has avx2 fma f16c bmi2 ;;
    avx512) cpu_has avx2 fma f16c bmi2 avx512f avx512cd avx512vl avx512dq avx512bw avx512_vnni \
      avx512vbmi avx512_bf16 ;;
  esac
}

median() {
  tr ' ' '\n' | grep -v -e '^$' -e '^-$' | sort -g |
    awk '{v[NR] = $1} END {if (NR == 0) print "-"; else if (NR % 2) printf "%.2f", v[(NR + 1) / 2];
         else printf "%.2f", (v[NR / 2] + v[NR / 2 + 1]) / 2}'
}

field() { # field NAME FILE: the value of NAME=... on the last line of FILE holding it, or "-"
  local v
  v="$(grep -o "\b$1=[^ ]*" "$2" 2>/dev/null | tail -1 | cut -d= -f2)" || true
  echo "${v:--}"
}

sum() { cksum <"$1" | cut -d' ' -f1; }

# --- prerequisites and the estimate --------------------------------------------------------------
for tool in cmake g++ taskset awk nm cksum; do
  command -v "$tool" >/dev/null || die "$tool not found"
done
[ -x "$SS_BIN/splitserve-bench-experts" ] || die "$SS_BIN/splitserve-bench-experts not found"
[ -x "$SS_BIN/splitserve-expert-worker" ] || die "$SS_BIN/splitserve-expert-worker not found"
[ -n "${GGML_TAR:-}${GGML_SRC:-}" ] || die "set GGML_TAR (pack_ggml.sh's archive) or GGML_SRC"
builds=()
for b in $BUILDS; do
  ggml_flags "$b" >/dev/null
  if build_runs_here "$b"; then
    builds+=("$b")
  else
    echo "ggml_compare: this CPU cannot run the $b build; skipped"
  fi
done
[ "${#builds[@]}" -gt 0 ] || die "no build this CPU can run"

# Seconds, from rough rates measured on a 16-core Xeon host: a core decodes ~4 GB/s of experts
# (capped at 60 GB/s) and does ~40 GFLOP/s in splitserve's T = 4..256 batches (1.24 TFLOP per run);
# splitserve's bench also loads the slice (~1 GB/s), reads 1 GiB before each token and makes ~3000
# T = 1 calls for its overhead figures; a ggml build ~60 s. The run prints the real figures.
estimate() {
  local nm have_data=0
  nm=$(echo "$GGML_REPACK" | wc -w)
  if [ -n "$(ls -A "$SS_DATA" 2>/dev/null)" ]; then have_data=1; fi
  awk -v threads="$THREADS" -v nb="${#builds[@]}" -v nm="$nm" -v reps="$REPEATS" -v L="$LAYERS" \
    -v E="$EXPERTS" -v tok="$TOKENS" -v gtok="$GGML_TOKENS" -v cores="$(nproc)" \
    -v have="$have_data" 'BEGIN {
      tokgb = L * 6 * 3 * 4096 * 2048 * 17 / 32 / 1e9; wgb = tokgb / 6 * E;
      t = nb * 60 + (have ? 0 : L * 1.5);
      n = split(threads, th, " ");
      for (i = 1; i <= n; i++) {
        rate = 4 * th[i]; if (rate > 60) rate = 60;
        ggml = 2 + wgb / cores + (gtok + 3) * tokgb / rate + 0.5;
        ss = 10 + wgb + (tok + 5) * 1.07 / 30 + tok * tokgb / rate;
        ss += 1240 / (40 * th[i]) + 3000 * 0.08 / rate;
        t += nb * reps * (3 + nm * ggml + ss);
      }
      printf "%d", t }'
}
est=$(estimate)
echo "ggml_compare: builds ${builds[*]}; threads $THREADS; $REPEATS repeat(s); $LAYERS layers x" \
  "$EXPERTS experts; splitserve $TOKENS tokens, ggml $GGML_TOKENS tokens; ggml weights modes" \
  "'$GGML_REPACK'"
echo "ggml_compare: estimated total $((est / 60)) min $((est % 60)) s, less what RESUME reuses" \
  "(rough: ~4 GB/s of decode per core, ~60 s per ggml build)"
if [ "${ESTIMATE_ONLY:-0}" = 1 ]; then exit 0; fi
for n in $THREADS; do first_cores "$n" >/dev/null || die "node 0 has fewer than $n cores"; done

start=$(date +%s)
mkdir -p "$OUT/logs" "$OUT/raw" "$OUT/bin"

# --- host --------------------------------------------------------------------------------------
{
  echo "date: $(date -u +%FT%TZ)"
  echo "uname: $(uname -a)"
  echo "nproc: $(nproc)"
  echo "thp enabled: $(cat /sys/kernel/mm/transparent_hugepage/enabled 2>/dev/null || echo ?)"
  echo "thp defrag: $(cat /sys/kernel/mm/transparent_hugepage/defrag 2>/dev/null || echo ?)"
  echo "OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-unset} GOMP_SPINCOUNT=${GOMP_SPINCOUNT:-unset}"
  echo "g++: $(g++ --version | head -1)"
  echo "cmake: $(cmake --version | head -1)"
  if command -v lscpu >/dev/null; then lscpu; fi
} >"$OUT/host.txt" 2>&1

# --- ggml: source, builds, drivers ---------------------------------------------------------------
if [ -n "${GGML_TAR:-}" ]; then
  src="$OUT/ggml-src/ggml"
  want="$(tar -xJOf "$GGML_TAR" ggml/GGML_COMMIT)"
  if [ "$RESUME" != 1 ] || [ "$(cat "$src/GGML_COMMIT" 2>/dev/null)" != "$want" ]; then
    rm -rf "$OUT/ggml-src"
    mkdir -p "$OUT/ggml-src"
    tar -xJf "$GGML_TAR" -C "$OUT/ggml-src"
  fi
else
  src="$(cd "$GGML_SRC" && pwd)"
fi
commit="$(cat "$src/GGML_COMMIT" 2>/dev/null || git -C "$src" rev-parse HEAD 2>/dev/null ||
  echo unknown)"
echo "ggml commit: $commit" | tee -a "$OUT/host.txt"

for b in "${builds[@]}"; do
  bdir="$OUT/ggml-build-$b"
  drv="$OUT/bin/ggml_moe_decode-$b"
  [ "$RESUME" = 1 ] || rm -rf "$bdir"
  t0=$(date +%s)
  # shellcheck disable=SC2046
  cmake -S "$src" -B "$bdir" $(ggml_flags "$b") >"$OUT/logs/ggml-$b-configure.log" 2>&1 ||
    die "configuring ggml ($b) failed; see $OUT/logs/ggml-$b-configure.log"
  cmake --build "$bdir" -j "$JOBS" >"$OUT/logs/ggml-$b-build.log" 2>&1 ||
    die "building ggml ($b) failed; see $OUT/logs/ggml-$b-build.log"
  libs=("$bdir/src/libggml.a" "$bdir/src/libggml-cpu.a" "$bdir/src/libggml-base.a")
  omp=()
  # (grep reads all of nm's output: with -q, nm could die of SIGPIPE and pipefail says no)
  if nm "$bdir/src/libggml-cpu.a" 2>/dev/null | grep GOMP_ >/dev/null; then omp=(-fopenmp); fi
  g++ -O3 -std=c++17 -I"$src/include" "$here/ggml_moe_decode.cc" "${libs[@]}" "${omp[@]}" \
    -lpthread -ldl -lm -o "$drv" >"$OUT/logs/driver-$b.log" 2>&1 ||
    die "building the driver against ggml ($b) failed; see $OUT/logs/driver-$b.log"
  variant="$(grep -m1 'Adding CPU backend' "$OUT/logs/ggml-$b-configure.log" | sed 's/.*: //')"
  echo "ggml $b: configured and built in $(($(date +%s) - t0)) s ($variant; OpenMP" \
    "${omp[*]:-no})" | tee -a "$OUT/host.txt"
done

# --- the runs ----------------------------------------------------------------------------------
# The first line of every raw file: what its result depends on.
config="# ggml_compare layers:$LAYERS experts:$EXPERTS tokens:$TOKENS ggml_tokens:$GGML_TOKENS"
config+=" bench:$(sum "$SS_BIN/splitserve-bench-experts")"
config+=" worker:$(sum "$SS_BIN/splitserve-expert-worker")"

# run_once FILE RESULT_FIELD CONFIG CMD...: CMD's output into FILE, its first line CONFIG, unless
# FILE has a result under that CONFIG already.
run_once() {
  local f="$1" key="$2" config="$3"
  shift 3
  if [ "$RESUME" = 1 ] && [ -f "$f" ] && [ "$(head -1 "$f")" = "$config" ] &&
    grep -q "\b$key=" "$f"; then
    echo "ggml_compare: reusing $f"
    return 0
  fi
  printf "%s\n+ %s\n" "$config" "$*" >"$f"
  "$@" >>"$f" 2>&1 || echo "ggml_compare: $f failed (exit $?)" >&2
}

printf "threads\tbuild\trepeat\tengine\tgbps\ttok_s\textra\traw\n" >"$OUT/runs.tsv"
record() { printf "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n" "$@" >>"$OUT/runs.tsv"; }

for n in $THREADS; do
  cpus="$(first_cores "$n")"
  for b in "${builds[@]}"; do
    ggml_config="$config ggml:$commit driver:$(sum "$OUT/bin/ggml_moe_decode-$b")"
    for r in $(seq 1 "$REPEATS"); do
      tag="t$n-$b-r$r"
      f="$OUT/raw/$tag-stream.txt"
      run_once "$f" stream_read_gbps "$config" \
        "$SS_BIN/splitserve-bench-experts" --stream_only --threads "$n"
      record "$n" "$b" "$r" stream "$(field stream_read_gbps "$f")" - - "$f"
      for mode in $GGML_REPACK; do
        f="$OUT/raw/$tag-ggml-repack$mode.txt"
        run_once "$f" gbps_median "$ggml_config" \
          taskset -c "$cpus" "$OUT/bin/ggml_moe_decode-$b" --threads "$n" --layers "$LAYERS" \
          --experts "$EXPERTS" --tokens "$GGML_TOKENS" --repack "$mode" --verbose
        record "$n" "$b" "$r" "ggml-repack$mode" "$(field gbps_median "$f")" \
          "$(field tok_s_median "$f")" "weights=$(field weights "$f")" "$f"
      done
      f="$OUT/raw/$tag-splitserve.txt"
      run_once "$f" decode_gbps "$config" \
        "$SS_BIN/splitserve-bench-experts" --threads "$n" --isa "$b" --tokens "$TOKENS" \
        --layers "$LAYERS" --experts "$EXPERTS" --workdir "$SS_DATA"
      got_cpus="$(grep -o 'cpus [0-9,]*' "$f" | head -1 | cut -d' ' -f2)" || true
      if [ -n "$got_cpus" ] && [ "$got_cpus" != "$cpus" ]; then
        echo "ggml_compare: splitserve ran on cpus $got_cpus, ggml on $cpus" >&2
      fi
      record "$n" "$b" "$r" splitserve "$(field decode_gbps "$f")" "$(field tokens_per_s "$f")" \
        "efficiency=$(field efficiency "$f") stream_in_run=$(field stream_gbps "$f")" "$f"
      echo "ggml_compare: $tag done ($(($(date +%s) - start)) s)"
    done
  done
done

# --- the table ---------------------------------------------------------------------------------
runs() { # runs THREADS BUILD ENGINE COLUMN: that column over the repeats, space-separated
  awk -F'\t' -v n="$1" -v b="$2" -v e="$3" -v c="$4" '$1 == n && $2 == b && $4 == e {
    printf "%s ", $c }' "$OUT/runs.tsv"
}
ratio() {
  awk -v a="$1" -v b="$2" 'BEGIN { if (a == "-" || b == "-" || b == 0) print "-";
    else printf "%.2f", a / b }'
}
row() { # row LABEL MEDIAN [RUNS]
  printf "  %-27s median %7s%s\n" "$1" "$2" "${3:+  runs: $3}"
}
{
  echo "ggml $commit; $LAYERS layers x $EXPERTS experts, top-6; splitserve $TOKENS tokens," \
    "ggml $GGML_TOKENS tokens per run; GB/s = distinct experts' bytes per token / token time"
  for b in "${builds[@]}"; do
    for n in $THREADS; do
      st="$(runs "$n" "$b" stream 5)"
      s="$(runs "$n" "$b" splitserve 5)"
      stm="$(echo "$st" | median)"
      sm="$(echo "$s" | median)"
      for mode in $GGML_REPACK; do
        e="ggml-repack$mode"
        g="$(runs "$n" "$b" "$e" 5)"
        gm="$(echo "$g" | median)"
        weights="$(runs "$n" "$b" "$e" 7 | cut -d' ' -f1)"
        echo
        echo "build $b, $n threads (cpus $(first_cores "$n")), ggml $weights:"
        row "ggml decode GB/s" "$gm" "$g"
        row "splitserve decode GB/s" "$sm" "$s"
        row "ratio splitserve / ggml" "$(ratio "$sm" "$gm")"
        row "stream GB/s" "$stm" "$st"
        row "ggml tokens/s" "$(runs "$n" "$b" "$e" 6 | median)" "$(runs "$n" "$b" "$e" 6)"
        row "splitserve tokens/s" "$(runs "$n" "$b" splitserve 6 | median)" \
          "$(runs "$n" "$b" splitserve 6)"
        row "ggml / stream, ss / stream" "$(ratio "$gm" "$stm") / $(ratio "$sm" "$stm")"
      done
    done
  done
  echo
  echo "total $(($(date +%s) - start)) s (estimated $est s); raw: $OUT/runs.tsv, $OUT/raw/"
} | tee "$OUT/table.txt"

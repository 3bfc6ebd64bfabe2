#!/usr/bin/env bash
# What `splitserve up --backend cuda` shows while a Flash-shaped dummy model loads (issue 29): once
# with its output in a log (lines every 5 s), once on a terminal (`script` gives it one: the bar
# below the children's relayed lines), each served a chat completion and stopped by its PID.
#   SS_PACK_DIR=.devpack/u bash tests/device/pack.sh splitserve splitserve-coordinator \
#       splitserve-gpu-worker splitserve-expert-worker      # here; carry .devpack
#   bash tests/device/up_load.sh $OUT [.devpack/u] [EXPERTS]   # there, ~2 min at 32 experts
set -uo pipefail
cd "$(dirname "$0")/../.."
source tests/device/env.sh
out=${1:?usage: tests/device/up_load.sh OUT [BIN] [EXPERTS]}
bin=${2:-.devpack/u}
experts=${3:-32}
port=18300
prebuilt_library_path "$bin"
libs=$LD_LIBRARY_PATH  # for our binaries only: script, stty and python3 keep the system's
unset LD_LIBRARY_PATH
model=$(mktemp -d /tmp/flash-load-XXXXXX)
cp models/flash/config.json "$model/"
gzip -dc tests/data/tokenizer/tokenizer.json.gz >"$model/tokenizer.json"
mkdir -p "$out"
overrides=${SS_OVERRIDES:-"{\"n_routed_experts\": $experts}"}
args="--backend ${SS_BACKEND:-cuda} --load-format dummy --model $model --hf-overrides '$overrides' --max-model-len 8192 --kv-tokens 16384 --port $port"
chat='{"model": "'"$(basename "$model")"'", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8}'

serve_once() {  # TAG FILE COMMAND...: starts it (output to FILE), waits for /ready (at most
  local tag=$1 file=$2  # 300 s), asks, stops `up`
  shift 2
  rm -f "$out/up.pid"
  "$@" >"$file" 2>&1 &
  local pid=$!
  for _ in $(seq 600); do
    http GET "http://127.0.0.1:$port/ready" >/dev/null 2>&1 && break
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.5
  done
  echo "$tag chat: $(http POST "http://127.0.0.1:$port/v1/chat/completions" "$chat" | head -c 300)"
  kill -INT "$(cat "$out/up.pid")"
  wait "$pid"
  echo "$tag exit: $?"
}

up="echo \$\$ >$out/up.pid; LD_LIBRARY_PATH=$libs exec $bin/splitserve up $args"
serve_once log "$out/up_log.txt" bash -c "$up"
echo "--- up's own lines (log mode):"
grep '^splitserve up' "$out/up_log.txt"
# `script` runs `up` on a pseudo-terminal of 150 columns; the typescript keeps every byte.
serve_once tty /dev/null script -q -e -c "stty cols 150; $up" "$out/up_tty.txt"
echo "--- terminal (bar redraws: $(grep -o $'\r\e\[K' "$out/up_tty.txt" | wc -l)):"
python3 - "$out/up_tty.txt" <<'PY'
import re, sys
s = re.sub(r"\x1b\[[0-9;]*m", "", open(sys.argv[1], "rb").read().decode("utf8", "replace"))
lines, line, col, i = [], [], 0, 0
while i < len(s):  # a terminal's view: \r, erase-to-end, newline
    if s.startswith("\x1b[K", i):
        del line[col:]; i += 3; continue
    c = s[i]
    if c == "\r": col = 0
    elif c == "\n": lines.append("".join(line)); line, col = [], 0
    else:
        if col < len(line): line[col] = c
        else: line.append(c)
        col += 1
    i += 1
print("\n".join(l[:200] for l in lines[-25:]))
bars = re.findall(r"\x1b\[K(splitserve up: \[[^\r]*)\r", s)
print(f"--- {len(bars)} bar frames; a few:")
for b in bars[:: max(1, len(bars) // 6)]: print(b[:200])
PY
rm -rf "$model" "$out/up.pid"

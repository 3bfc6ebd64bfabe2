#!/usr/bin/env bash
# deploy/prometheus.yml against a real Prometheus (Debian 12's 2.42) scraping a real cluster:
# `promtool check config` passes on the file as shipped; then the file's scrape jobs, their targets
# pointed at `splitserve up` on the bundled model (coordinator on PORT, workers on PORT+1..), are
# served by a Prometheus on 127.0.0.1 for a few seconds after a chat request, and its query API
# must show
#   - every target up, with the process_* series;
#   - vLLM's series list under splitserve: (job splitserve-coordinator) and, through the file's
#     relabel rule, the same under vllm: (job splitserve-coordinator-vllm);
#   - vLLM's bucket ranges: time to first token up to 2,560 s, e2e and the request phases up to
#     7,680 s, inter-token latency up to 80 s;
#   - every splitserve: series the Grafana dashboard (deploy/grafana) queries, and each of its
#     queries evaluating (its variables set to match anything, one layer, 2 hot experts).
#
#   prometheus_scrape_test.sh SOURCE_DIR SPLITSERVE_BIN WORK_DIR
#
# Prometheus is not installed (Debian's package would enable a Prometheus service on :9090):
# `apt-get download prometheus` fetches the package into WORK_DIR (kept between runs) and
# `dpkg -x` unpacks its two binaries there. Exits 77 (ctest's skip) when it cannot be fetched.
# Everything started here listens on 127.0.0.1 and is stopped by its PID.
set -euo pipefail
src="$1"
splitserve="$2"
work="$3"
mkdir -p "$work"
work="$(cd "$work" && pwd)"

skip() {
  echo "[  SKIPPED ] prometheus_scrape_test: $*"
  exit 77
}
fail() {
  echo "prometheus_scrape_test: FAILED: $*" >&2
  exit 1
}

prom="$work/pkg/usr/bin/prometheus"
promtool="$work/pkg/usr/bin/promtool"
if [ ! -x "$prom" ]; then
  command -v apt-get >/dev/null 2>&1 || skip "apt-get is missing (a Debian system fetches prometheus with it)"
  (cd "$work" && rm -f prometheus_*.deb && apt-get download prometheus >/dev/null 2>&1) ||
    skip "apt-get download prometheus failed (no package lists or no network to the Debian mirror)"
  dpkg -x "$work"/prometheus_*.deb "$work/pkg"
fi
"$promtool" check config "$src/deploy/prometheus.yml" >/dev/null || fail "promtool check config"

port="$(python3 "$src/tests/common/free_port_block.py")"  # up takes port+1, ... too
prom_port="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
}
trap cleanup EXIT

"$splitserve" up --port "$port" --log-dir "$work/up-logs" >"$work/up.out" 2>&1 &
pids+=($!)
# Ready once up prints its banner (after the coordinator's /ready), which names the workers' ports.
for _ in $(seq 1 600); do
  grep -q "workers: 127.0.0.1:" "$work/up.out" 2>/dev/null && break
  kill -0 "${pids[0]}" 2>/dev/null || { cat "$work/up.out" >&2; fail "splitserve up exited"; }
  sleep 0.1
done
grep -q "workers: 127.0.0.1:" "$work/up.out" || fail "splitserve up not ready in 60 s"
children="$(sed -n 's/.*workers: 127.0.0.1:\([0-9]*\)-\([0-9]*\)\/metrics.*/\1 \2/p' "$work/up.out")"
[ -n "$children" ] || fail "no worker metrics ports in up's banner"
read -r first last <<<"$children"
curl -sf "http://127.0.0.1:$port/v1/chat/completions" -H 'Content-Type: application/json' \
  -d '{"model": "tiny", "messages": [{"role": "user", "content": "Hello!"}], "max_tokens": 8}' \
  >/dev/null || fail "chat request"
# And one client error, so that the error counter has a series (it has one per status code).
[ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port/v1/chat/completions" \
  -H 'Content-Type: application/json' -d '{not json')" = 400 ] || fail "a malformed request is not a 400"

# The shipped file with its targets on this machine and a 1 s scrape interval.
python3 - "$src/deploy/prometheus.yml" "$work/prometheus.yml" "$port" "$first" "$last" <<'PY'
import re, sys
src, dst, port, first, last = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
workers = ", ".join(f'"127.0.0.1:{p}"' for p in range(first, last + 1))
job = None
filled = set()
out = []
for line in open(src):
    m = re.match(r"\s*- job_name:\s*(\S+)", line)
    if m:
        job = m.group(1)
    if re.match(r"\s*scrape_interval:", line):
        line = re.sub(r"scrape_interval:.*", "scrape_interval: 1s", line)
    m = re.match(r"(\s*- targets:\s*)\[.*\]", line)
    if m:  # a job's first target group gets this machine's processes, its other groups none
        targets = f'"127.0.0.1:{port}"' if job.startswith("splitserve-coordinator") else workers
        line = f"{m.group(1)}[{targets if job not in filled else ''}]\n"
        filled.add(job)
    out.append(line)
open(dst, "w").write("".join(out))
PY
"$promtool" check config "$work/prometheus.yml" >/dev/null || fail "promtool check config (rewritten)"
rm -rf "$work/tsdb"  # nothing from an earlier run may answer the queries
"$prom" --config.file="$work/prometheus.yml" --storage.tsdb.path="$work/tsdb" \
  --web.listen-address="127.0.0.1:$prom_port" >"$work/prometheus.log" 2>&1 &
pids+=($!)

# Checked every 2 s until it holds, for up to 40 s (Prometheus starting and scraping on a busy
# machine); the last round's problems are printed.
python3 - "$prom_port" "$src/deploy/grafana/splitserve-dashboard.json" <<'PY' || fail "the queries above"
import json, re, sys, time, urllib.error, urllib.parse, urllib.request
base = f"http://127.0.0.1:{sys.argv[1]}/api/v1/"
def query(q):
    try:
        with urllib.request.urlopen(base + "query?query=" + urllib.parse.quote(q), timeout=10) as r:
            return json.load(r)["data"]["result"]
    except OSError:
        return []
vllm = ["num_requests_running", "num_requests_waiting", "kv_cache_usage_perc",
        "prefix_cache_queries_total", "prefix_cache_hits_total", "num_preemptions_total",
        "prompt_tokens_total", "generation_tokens_total", "request_success_total",
        "iteration_tokens_total_bucket", "request_prompt_tokens_bucket",
        "request_generation_tokens_bucket", "request_params_n_bucket",
        "request_params_max_tokens_bucket", "time_to_first_token_seconds_bucket",
        "inter_token_latency_seconds_bucket", "request_time_per_output_token_seconds_bucket",
        "e2e_request_latency_seconds_bucket", "request_queue_time_seconds_bucket",
        "request_inference_time_seconds_bucket", "request_prefill_time_seconds_bucket",
        "request_decode_time_seconds_bucket"]
dashboard = json.load(open(sys.argv[2]))
dashboard_exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
dashboard_series = {m for e in dashboard_exprs for m in re.findall(r"splitserve:[a-z0-9_]+", e)}
variables = {"$__rate_interval": "1m", "$expert_layer": "0", "$hot_experts": "2"}
def query_error(q):
    """None when `q` evaluates, else Prometheus's error."""
    try:
        with urllib.request.urlopen(base + "query?query=" + urllib.parse.quote(q), timeout=10) as r:
            return None if json.load(r).get("status") == "success" else "no success"
    except urllib.error.HTTPError as e:
        return e.read().decode(errors="replace")[:300]
    except OSError as e:
        return str(e)
def check():
  problems = []
  down = [s["metric"] for s in query("up") if s["value"][1] != "1"]
  if down or not query("up"):
      problems.append(f"targets down: {down}")
  for s in query("up"):
      inst, job = s["metric"]["instance"], s["metric"]["job"]
      if not query(f'process_resident_memory_bytes{{instance="{inst}",job="{job}"}}'):
          problems.append(f"no process_resident_memory_bytes from {job} {inst}")
  for name in vllm:
      for prefix, job in (("splitserve:", "splitserve-coordinator"), ("vllm:", "splitserve-coordinator-vllm")):
          if not query(f'{prefix}{name}{{job="{job}"}}'):
              problems.append(f"{prefix}{name} missing in job {job}")
      if query(f'vllm:{name}{{job="splitserve-coordinator"}}'):
          problems.append(f"vllm:{name} in the plain job")
  def top_bucket(name):
      les = [float(s["metric"]["le"]) for s in query(f'vllm:{name}_bucket') if s["metric"]["le"] != "+Inf"]
      return max(les) if les else None
  for name, want in (("time_to_first_token_seconds", 2560), ("e2e_request_latency_seconds", 7680),
                     ("request_queue_time_seconds", 7680), ("request_prefill_time_seconds", 7680),
                     ("inter_token_latency_seconds", 80)):
      if top_bucket(name) != want:
          problems.append(f"{name}: top bucket {top_bucket(name)}, vLLM's is {want}")
  # Every series the Grafana dashboard queries is one a process exports.
  for name in sorted(dashboard_series):
      if not query(f'count({{__name__="{name}"}})'):
          problems.append(f"the dashboard queries {name}, which no process exports")
  for e in dashboard_exprs:
      q = e
      for k, v in variables.items():
          q = q.replace(k, v)
      q = re.sub(r"\$[a-z_]+", ".*", q)
      if (err := query_error(q)) is not None:
          problems.append(f"the dashboard query {q} does not evaluate: {err}")
  ttft = query('vllm:time_to_first_token_seconds_count')
  if not ttft or float(ttft[0]["value"][1]) < 1:
      problems.append(f"the request is not counted: {ttft}")
  return problems
deadline = time.time() + 40
while True:
    time.sleep(2)
    problems = check()
    if not problems or time.time() > deadline:
        break
for p in problems:
    print("prometheus_scrape_test:", p, file=sys.stderr)
print(f"prometheus_scrape_test: {len(query('up'))} targets, {len(vllm)} vLLM series checked under "
      f"both names, {len(dashboard_series)} dashboard series, {len(problems)} problem(s)")
sys.exit(1 if problems else 0)
PY

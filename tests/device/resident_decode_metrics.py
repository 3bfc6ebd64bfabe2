#!/usr/bin/env python3
"""Resident experts' decode figures from scrapes of a cluster's Prometheus endpoints, for
tests/device/resident_decode.sh.

  resident_decode_metrics.py delta BEFORE_DIR AFTER_DIR [key=value ...]
      prints one JSON line: the differences between the scrapes (each DIR holds one `*.txt`
      scrape per endpoint and `time` with the scrape's epoch seconds; the series of all
      endpoints are summed) plus the given key=value pairs (numbers where they parse):
        tokens        splitserve:generation_tokens_total (vllm: accepted too)
        gpu, cpu      splitserve:gpu_worker_routed_choices_total{path="gpu"|"cpu"}, summed
        hit           gpu / (gpu + cpu); null without choices
        layers        {layer: hit} per layer
        hit_learned   the hit rate of the learned-routing layers (layer >= SS_HASH_LAYERS, 3)
        top_quarter   the learned layers' choices that went to the hottest quarter of their
                      experts in the interval (splitserve:gpu_worker_expert_routed_total): what a
                      quarter placed by frequency could serve at best
        cpu_bytes     splitserve:gpu_worker_expert_cpu_read_bytes_total
        bytes_per_token  cpu_bytes / tokens
        rebalances, rebalance_bytes  splitserve:gpu_worker_expert_rebalance{s,_bytes}_total
        seconds, tok_s   the time between the scrapes, tokens / seconds
        total_rebalances, total_rebalance_bytes  the AFTER scrape's own values (cumulative)
        steps         splitserve:gpu_worker_steps_total
        engine_ms     the expert workers' engine time a step (expert_call_seconds, all layers)
        part_ms       {part: ms a step} of layer_latency_seconds summed over the layers, a
                      step being a timed one (the lowest layer's attention count: the GPU
                      workers' --layer_timing_every times every Nth step)
        graph         {how: [steps, ms each]} of gpu_worker_graph_steps_total and
                      gpu_worker_graph_step_seconds (launched, captured, replayed, none)
        step_ms       {name: ms a step} of the step-time histograms: round_trip and worker
                      (the coordinator's engine_step_seconds), total, backend and sample (the
                      GPU workers' gpu_worker_step_seconds), each over its own count
  resident_decode_metrics.py decode-table JSONL   the resident-fraction x concurrency table
      (rows with keys frac, c, tpot_ms): tok/s = c x 1000 / mean TPOT, hit rate, CPU bytes per
      token, and both ratios against the row of fraction 0 at the same concurrency
  resident_decode_metrics.py window-table JSONL   decode-only windows (rows with key frac): per
      step the step's time (seconds / steps), the engine's, G = step - engine, the parts, the
      hit rate and tok/s
  resident_decode_metrics.py skew-table JSONL     the convergence table (rows with key t):
      time, window hit rate (all layers; the learned-routing ones), rebalances and GB moved
      (cumulative), tok/s
"""

import collections
import json
import math
import os
import re
import sys

SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)')
LABEL = re.compile(r'(\w+)="([^"]*)"')

TOKENS = ('splitserve:generation_tokens_total', 'vllm:generation_tokens_total')
CHOICES = 'splitserve:gpu_worker_routed_choices_total'
CPU_BYTES = 'splitserve:gpu_worker_expert_cpu_read_bytes_total'
REBALANCES = 'splitserve:gpu_worker_expert_rebalances_total'
REBALANCE_BYTES = 'splitserve:gpu_worker_expert_rebalance_bytes_total'
STEPS = 'splitserve:gpu_worker_steps_total'
ENGINE = 'splitserve:expert_call_seconds_sum'
LATENCY = 'splitserve:layer_latency_seconds_sum'  # {layer, part}
STEP_TIMES = (('round_trip', 'splitserve:engine_step_seconds', 'round_trip'),
              ('worker', 'splitserve:engine_step_seconds', 'worker'),
              ('gw_total', 'splitserve:gpu_worker_step_seconds', 'total'),
              ('gw_backend', 'splitserve:gpu_worker_step_seconds', 'backend'),
              ('gw_sample', 'splitserve:gpu_worker_step_seconds', 'sample'))
GRAPH_STEPS = 'splitserve:gpu_worker_graph_steps_total'  # {how}
GRAPH_SECONDS = 'splitserve:gpu_worker_graph_step_seconds'  # {how}
ROUTED = 'splitserve:gpu_worker_expert_routed_total'  # {layer, expert}: choices of that expert
# Layers below this route by the token id (tid2eid; Flash: num_hash_layers 3), which the router
# skew does not change: hit_learned leaves them out.
HASH_LAYERS = int(os.environ.get('SS_HASH_LAYERS', '3'))


def parse(path):
    """[(name, {labels}, value)] of one scrape."""
    out = []
    with open(path) as f:
        for line in f:
            if line.startswith('#'):
                continue
            m = SAMPLE.match(line)
            if not m:
                continue
            try:
                v = float(m.group(3))
            except ValueError:
                continue
            out.append((m.group(1), dict(LABEL.findall(m.group(2) or '')), v))
    return out


class Scrape:
    """The summed series of one scrape directory."""

    def __init__(self, d):
        self.samples = []
        for name in sorted(os.listdir(d)):
            if name.endswith('.txt'):
                self.samples += parse(os.path.join(d, name))
        t = os.path.join(d, 'time')
        self.time = float(open(t).read().strip()) if os.path.exists(t) else None

    def total(self, names, **match):
        if isinstance(names, str):
            names = (names,)
        return sum(v for n, lab, v in self.samples
                   if n in names and all(lab.get(k) == w for k, w in match.items()))

    def routed(self):
        out = collections.defaultdict(float)
        for n, lab, v in self.samples:
            if n == ROUTED and 'layer' in lab and 'expert' in lab:
                out[(int(lab['layer']), int(lab['expert']))] += v
        return out

    def by_layer(self, path):
        out = collections.defaultdict(float)
        for n, lab, v in self.samples:
            if n == CHOICES and lab.get('path') == path and 'layer' in lab:
                out[int(lab['layer'])] += v
        return out


def ratio(a, b):
    return a / b if b else None


def delta(before_dir, after_dir, extra):
    b, a = Scrape(before_dir), Scrape(after_dir)
    r = {}
    r['tokens'] = a.total(TOKENS) - b.total(TOKENS)
    r['gpu'] = a.total(CHOICES, path='gpu') - b.total(CHOICES, path='gpu')
    r['cpu'] = a.total(CHOICES, path='cpu') - b.total(CHOICES, path='cpu')
    r['hit'] = ratio(r['gpu'], r['gpu'] + r['cpu'])
    ga, gb, ca, cb = a.by_layer('gpu'), b.by_layer('gpu'), a.by_layer('cpu'), b.by_layer('cpu')
    layers, learned = {}, [0.0, 0.0]
    for layer in sorted(set(ga) | set(ca)):
        g = ga[layer] - gb.get(layer, 0.0)
        c = ca[layer] - cb.get(layer, 0.0)
        layers[str(layer)] = ratio(g, g + c)
        if layer >= HASH_LAYERS:
            learned[0] += g
            learned[1] += g + c
    r['layers'] = layers
    r['hit_learned'] = ratio(*learned)
    # The hottest quarter of each learned layer's experts by this interval's choices: the share
    # of the choices a placement of a quarter of the experts by frequency could serve.
    ra, rb = a.routed(), b.routed()
    per_layer = collections.defaultdict(list)
    for (layer, expert), v in ra.items():
        if layer >= HASH_LAYERS:
            per_layer[layer].append(v - rb.get((layer, expert), 0.0))
    top = total = 0.0
    for counts in per_layer.values():
        counts.sort(reverse=True)
        top += sum(counts[:len(counts) // 4])
        total += sum(counts)
    r['top_quarter'] = ratio(top, total)
    r['cpu_bytes'] = a.total(CPU_BYTES) - b.total(CPU_BYTES)
    r['bytes_per_token'] = ratio(r['cpu_bytes'], r['tokens'])
    r['rebalances'] = a.total(REBALANCES) - b.total(REBALANCES)
    r['rebalance_bytes'] = a.total(REBALANCE_BYTES) - b.total(REBALANCE_BYTES)
    r['total_rebalances'] = a.total(REBALANCES)
    r['total_rebalance_bytes'] = a.total(REBALANCE_BYTES)
    r['seconds'] = a.time - b.time if a.time is not None and b.time is not None else None
    r['tok_s'] = ratio(r['tokens'], r['seconds'])
    r['have_choices'] = any(n == CHOICES for n, _, _ in a.samples)
    r['steps'] = a.total(STEPS) - b.total(STEPS)
    r['engine_ms'] = ratio(1e3 * (a.total(ENGINE) - b.total(ENGINE)), r['steps'])
    parts = {lab.get('part') for n, lab, _ in a.samples if n == LATENCY}
    count = LATENCY.replace('_sum', '_count')
    layers = [int(lab['layer']) for n, lab, _ in a.samples if n == count and 'layer' in lab]
    timed = r['steps']
    if layers:
        low = str(min(layers))
        timed = (a.total(count, part='attention', layer=low) -
                 b.total(count, part='attention', layer=low))
    r['timed_steps'] = timed
    r['part_ms'] = {p: ratio(1e3 * (a.total(LATENCY, part=p) - b.total(LATENCY, part=p)),
                             timed) for p in sorted(x for x in parts if x)}
    r['graph'] = {}
    for how in ('launched', 'captured', 'replayed', 'none'):
        n = a.total(GRAPH_STEPS, how=how) - b.total(GRAPH_STEPS, how=how)
        t = a.total(GRAPH_SECONDS + '_sum', how=how) - b.total(GRAPH_SECONDS + '_sum', how=how)
        if n:
            r['graph'][how] = [n, 1e3 * t / n]
    r['step_ms'] = {}
    for key, name, part in STEP_TIMES:
        n = a.total(name + '_count', part=part) - b.total(name + '_count', part=part)
        t = a.total(name + '_sum', part=part) - b.total(name + '_sum', part=part)
        r['step_ms'][key] = ratio(1e3 * t, n)
    for kv in extra:
        k, _, v = kv.partition('=')
        try:
            r[k] = float(v)
        except ValueError:
            r[k] = v
    return r


def fmt(v, spec, none='n/a'):
    return none if v is None or (isinstance(v, float) and math.isnan(v)) else format(v, spec)


def rows(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def layer_span(r):
    vals = [v for v in (r.get('layers') or {}).values() if v is not None]
    return f'{min(vals):.2f}-{max(vals):.2f}' if vals else 'n/a'


PARTS = ('attention', 'moe_gpu', 'moe_cpu')


def frac_key(r):
    """Sorts a numeric --gpu-experts fraction before a named one (auto)."""
    f = r.get('frac')
    return (0, f, '') if isinstance(f, (int, float)) else (1, 0, str(f))


def frac_name(r):
    f = r.get('frac')
    return f'{f * 100:g} %' if isinstance(f, (int, float)) else str(f)


def decode_table(path):
    rs = rows(path)
    for r in rs:
        tpot = r.get('tpot_ms') or 0
        r['rate'] = r['c'] * 1000 / tpot if tpot else None
    base = {r['c']: r for r in rs if r.get('frac') == 0}
    print('| resident | concurrency | tok/s (TPOT ms) | x 0 % | hit rate (layers) | '
          'CPU GB / token | x 0 % | rebalances |')
    print('|---|---|---|---|---|---|---|---|')
    for r in sorted(rs, key=lambda r: (r['c'], frac_key(r))):
        b = base.get(r['c'])
        speed = ratio(r['rate'], b['rate']) if b and r['rate'] and b['rate'] else None
        bytes_x = (ratio(r['bytes_per_token'], b['bytes_per_token'])
                   if b and r['bytes_per_token'] is not None and b['bytes_per_token'] else None)
        bpt = r['bytes_per_token'] / 1e9 if r['bytes_per_token'] is not None else None
        print(f"| {frac_name(r)} | {r['c']:g} | {fmt(r['rate'], '.2f')} "
              f"({fmt(r.get('tpot_ms'), '.1f')}) | {fmt(speed, '.2f')}{'x' if speed else ''} | "
              f"{fmt(r['hit'], '.3f')} "
              f"({layer_span(r)}) | {fmt(bpt, '.3f')} | {fmt(bytes_x, '.2f')}{'x' if bytes_x else ''} | "
              f"{r['rebalances']:g} |")
    # The step predicted from the bytes removed: the 0 % row's TPOT less the engine time those
    # bytes took, TPOT' = TPOT_0 - engine_0 x (1 - bytes' / bytes_0).
    print()
    print('| resident | concurrency | per step ms: engine, ' + ', '.join(PARTS) +
          ' | TPOT predicted from the bytes | measured | measured / predicted |')
    print('|---|---|---|---|---|---|')
    for r in sorted(rs, key=lambda r: (r['c'], frac_key(r))):
        b = base.get(r['c'])
        pm = r.get('part_ms') or {}
        pred = None
        if b and b.get('engine_ms') and b.get('bytes_per_token') and r.get('bytes_per_token'):
            pred = b['tpot_ms'] - b['engine_ms'] * (1 - r['bytes_per_token'] / b['bytes_per_token'])
        print(f"| {frac_name(r)} | {r['c']:g} | {fmt(r.get('engine_ms'), '.1f')}, " +
              ', '.join(fmt(pm.get(p), '.1f') for p in PARTS) +
              f" | {fmt(pred, '.1f')} | {fmt(r.get('tpot_ms'), '.1f')} | "
              f"{fmt(ratio(r.get('tpot_ms'), pred), '.2f')} |")
    for r in sorted(rs, key=lambda r: (r['c'], frac_key(r))):
        per = ' '.join(f"{k}:{fmt(v, '.2f')}" for k, v in sorted(
            (r.get('layers') or {}).items(), key=lambda kv: int(kv[0])))
        print(f"hit by layer, {frac_name(r)} resident, c={r['c']:g}: {per or 'n/a'}")


def skew_table(path):
    rs = sorted(rows(path), key=lambda r: r['t'])
    print('| time s | window hit rate (layers) | learned layers | hottest quarter\'s share | '
          'rebalances | GB moved | tok/s |')
    print('|---|---|---|---|---|---|---|')
    for r in rs:
        print(f"| {r['t']:.0f} | {fmt(r['hit'], '.3f')} ({layer_span(r)}) | "
              f"{fmt(r.get('hit_learned'), '.3f')} | {fmt(r.get('top_quarter'), '.3f')} | "
              f"{r['total_rebalances']:g} | {r['total_rebalance_bytes'] / 1e9:.2f} | "
              f"{fmt(r['tok_s'], '.2f')} |")


def window_table(path):
    rs = sorted(rows(path), key=frac_key)
    keys = [k for k, _, _ in STEP_TIMES]
    print('| resident | hit rate | tok/s | step ms | engine ms | G = step - engine ms | '
          'per step ms: ' + ', '.join(PARTS) + ' | step times ms: ' + ', '.join(keys) +
          ' | graph steps: how steps (backend ms each) |')
    print('|---|---|---|---|---|---|---|---|---|')
    for r in rs:
        step = ratio(1e3 * r['seconds'], r['steps']) if r.get('seconds') else None
        g = step - r['engine_ms'] if step is not None and r.get('engine_ms') is not None else None
        pm = r.get('part_ms') or {}
        sm = r.get('step_ms') or {}
        print(f"| {frac_name(r)} | {fmt(r['hit'], '.3f')} | {fmt(r['tok_s'], '.2f')} | "
              f"{fmt(step, '.2f')} | {fmt(r.get('engine_ms'), '.2f')} | {fmt(g, '.2f')} | " +
              ', '.join(fmt(pm.get(p), '.2f') for p in PARTS) + ' | ' +
              ', '.join(fmt(sm.get(k), '.3f') for k in keys) + ' | ' +
              ', '.join(f"{h} {int(v[0])} ({v[1]:.2f})" for h, v in (r.get('graph') or {}).items())
              + ' |')


def main(argv):
    if len(argv) >= 3 and argv[0] == 'delta':
        print(json.dumps(delta(argv[1], argv[2], argv[3:])))
    elif len(argv) == 2 and argv[0] == 'decode-table':
        decode_table(argv[1])
    elif len(argv) == 2 and argv[0] == 'window-table':
        window_table(argv[1])
    elif len(argv) == 2 and argv[0] == 'skew-table':
        skew_table(argv[1])
    else:
        sys.exit(__doc__)


if __name__ == '__main__':
    main(sys.argv[1:])

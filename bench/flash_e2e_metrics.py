#!/usr/bin/env python3
"""The per-layer time split and the expert worker's work between two scrapes of a cluster's
Prometheus endpoints (bench/flash_e2e.sh takes them before and after each phase).

  flash_e2e_metrics.py BEFORE_DIR AFTER_DIR [--tokens N] [--prefill-tokens N]

Each DIR holds one `*.txt` scrape per endpoint (the coordinator's and every worker's
`/metrics`), the same file names in both. From the differences:

  - GPU workers, `splitserve:layer_latency_seconds{layer,part}` (part attention | moe_gpu |
    moe_cpu | allreduce): mean seconds per micro-batch of each part of each layer;
  - expert workers, `splitserve:expert_call_seconds{layer}` (engine time of one call) and
    `splitserve:expert_weight_bytes_total` (bytes of expert weights read);
  - transport = moe_cpu (the GPU worker's wait for the routed experts) - the engine's time, per
    call: shared memory / gRPC, the call's queueing and the copies.

Prints one line per layer and the totals over the layers (ms per micro-batch), then
`name=value` pairs on the last line: engine_s (the expert engine's seconds in the phase),
expert_bytes, steps, and with --tokens the bytes per token.
"""

import argparse
import collections
import os
import re
import sys

SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)')
LABEL = re.compile(r'(\w+)="([^"]*)"')


def parse(path):
    """{(name, frozenset(labels)): value} of one scrape."""
    out = {}
    with open(path) as f:
        for line in f:
            if line.startswith('#'):
                continue
            m = SAMPLE.match(line)
            if not m:
                continue
            labels = frozenset(LABEL.findall(m.group(2) or ''))
            try:
                out[(m.group(1), labels)] = float(m.group(3))
            except ValueError:
                pass
    return out


def scrape_dir(d):
    merged = collections.defaultdict(float)
    for name in sorted(os.listdir(d)):
        if name.endswith('.txt'):
            for k, v in parse(os.path.join(d, name)).items():
                merged[k] += v
    return merged


def delta(before, after):
    return {k: v - before.get(k, 0.0) for k, v in after.items()}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('before')
    ap.add_argument('after')
    ap.add_argument('--tokens', type=float, default=0, help='tokens generated in the phase')
    args = ap.parse_args()
    d = delta(scrape_dir(args.before), scrape_dir(args.after))

    layer_sum = collections.defaultdict(float)  # (layer, part) -> seconds
    layer_cnt = collections.defaultdict(float)
    engine_sum = collections.defaultdict(float)  # layer -> seconds
    engine_cnt = collections.defaultdict(float)
    expert_bytes = 0.0
    for (name, labels), v in d.items():
        lab = dict(labels)
        if name == 'splitserve:layer_latency_seconds_sum' and 'layer' in lab:
            layer_sum[(int(lab['layer']), lab['part'])] += v
        elif name == 'splitserve:layer_latency_seconds_count' and 'layer' in lab:
            layer_cnt[(int(lab['layer']), lab['part'])] += v
        elif name == 'splitserve:expert_call_seconds_sum' and 'layer' in lab:
            engine_sum[int(lab['layer'])] += v
        elif name == 'splitserve:expert_call_seconds_count' and 'layer' in lab:
            engine_cnt[int(lab['layer'])] += v
        elif name == 'splitserve:expert_weight_bytes_total':
            expert_bytes += v

    layers = sorted({l for (l, _) in layer_sum})
    parts = ['attention', 'moe_gpu', 'moe_cpu', 'allreduce']
    total = collections.defaultdict(float)
    steps = 0.0
    print('layer  attention_ms  shared+router_ms  routed_call_ms  engine_ms  transport_ms')
    for l in layers:
        n = layer_cnt.get((l, 'attention'), 0.0)
        if n <= 0:
            continue
        steps = max(steps, n)
        ms = {p: 1e3 * layer_sum.get((l, p), 0.0) / n for p in parts}
        # Expert calls per micro-batch: every call of the layer over the GPU worker's steps (a
        # step without routed tokens makes no call; the mean then spreads its engine time).
        eng = 1e3 * engine_sum.get(l, 0.0) / n
        transport = ms['moe_cpu'] - eng
        for k, v in (('attention', ms['attention']), ('moe_gpu', ms['moe_gpu']),
                     ('moe_cpu', ms['moe_cpu']), ('engine', eng), ('transport', transport),
                     ('allreduce', ms['allreduce'])):
            total[k] += v
        print(f'{l:5d}  {ms["attention"]:12.3f}  {ms["moe_gpu"]:16.3f}  {ms["moe_cpu"]:14.3f}  '
              f'{eng:9.3f}  {transport:12.3f}')
    print(f'total  {total["attention"]:12.3f}  {total["moe_gpu"]:16.3f}  {total["moe_cpu"]:14.3f}  '
          f'{total["engine"]:9.3f}  {total["transport"]:12.3f}   (ms per micro-batch, '
          f'{steps:.0f} micro-batches)')
    engine_s = sum(engine_sum.values())
    pairs = [f'engine_s={engine_s:.3f}', f'expert_bytes={expert_bytes:.0f}', f'steps={steps:.0f}']
    for k in ('attention', 'moe_gpu', 'moe_cpu', 'engine', 'transport'):
        pairs.append(f'{k}_ms={total[k]:.3f}')
    if args.tokens > 0:
        pairs.append(f'bytes_per_token={expert_bytes / args.tokens:.0f}')
    print(' '.join(pairs))
    return 0


if __name__ == '__main__':
    sys.exit(main())

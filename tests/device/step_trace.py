#!/usr/bin/env python3
"""Where a decode step's time goes on the host and the GPU, from a trace of tests/device/
kernel_trace.cc with SS_TRACE_API=1 (kernels, memcpys and CUDA runtime calls of one process).

  step_trace.py TRACE.csv [STEPS]

The trace of `splitserve up`'s GPU worker (the library built and carried as tests/device/
timeline.sh says; the coordinator and the expert workers load no CUDA, so only the GPU worker
writes it, at its exit):
  CUDA_INJECTION64_PATH=$PWD/.devpack/libss_kernel_trace.so SS_TRACE_API=1 \
    SS_TRACE_OUT=/tmp/trace.csv SS_FRACTIONS=auto SS_WINDOW_TOKENS=800 \
    bash tests/device/resident_decode.sh OUT window
  python3 tests/device/step_trace.py /tmp/trace.csv 40

A step is the interval from one cudaGraphLaunch of the stepping thread (the thread that made the
most of them) to its next one; the last STEPS (default 40) complete steps are read, the final
two of the trace left out. Prints, as medians over those steps:
  - the step's period, the GPU's busy time (the union of kernels and memcpys) and its idle rest;
  - the runtime calls of every thread, by name: count and host time a step;
  - the memcpys by kind (1 HtoD, 2 DtoH, 8 DtoD) and size: count and time a step;
the GPU's idle gaps inside steps longer than 5 us, by the kernels on either side (count a step
and median length), so a recurring wait can be named; then the median-period step as a timeline: runtime calls of the stepping thread, memcpys, and
runs of kernels (merged while the GPU idles less than 5 us between them), each with its start
offset from the graph launch and its duration, so the GPU's idle stretches and what the host was
doing then can be read off.
"""

import bisect
import collections
import statistics
import sys

MERGE_NS = 5000


def load(path):
    kernels, copies, calls = [], [], []
    with open(path) as f:
        for line in f:
            parts = line.rstrip('\n').split(',', 3)
            if len(parts) != 4:
                continue
            s, e, stream, name = int(parts[0]), int(parts[1]), int(parts[2]), parts[3]
            if name.startswith('api:'):
                calls.append((s, e, stream, name[4:]))
            elif name.startswith('memcpy:'):
                copies.append((s, e, stream, name[7:]))
            else:
                kernels.append((s, e, stream, name))
    for v in (kernels, copies, calls):
        v.sort()
    return kernels, copies, calls


def union(intervals):
    total, cur_s, cur_e = 0, None, None
    for s, e in sorted(intervals):
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    if cur_e is not None:
        total += cur_e - cur_s
    return total


def within(records, a, b):
    """The records (sorted by start) that start in [a, b)."""
    return records[bisect.bisect_left(records, (a,)):bisect.bisect_left(records, (b,))]


def med(values):
    return statistics.median(values) if values else 0.0


def main(argv):
    path = argv[1]
    n_steps = int(argv[2]) if len(argv) > 2 else 40
    kernels, copies, calls = load(path)
    launches = collections.defaultdict(list)
    for s, e, tid, name in calls:
        if name.startswith('cudaGraphLaunch'):
            launches[tid].append(s)
    if not launches:
        print('no cudaGraphLaunch in the trace')
        return 1
    tid = max(launches, key=lambda t: len(launches[t]))
    starts = launches[tid][:-2][-(n_steps + 1):]
    print(f'stepping thread {tid}: {len(launches[tid])} graph launches; reading {len(starts) - 1} steps')
    steps = []
    for a, b in zip(starts, starts[1:]):
        ks, cs, api = within(kernels, a, b), within(copies, a, b), within(calls, a, b)
        busy = union([(s, min(e, b)) for s, e, _, _ in ks + cs])
        per_call = collections.Counter()
        per_count = collections.Counter()
        for s, e, t, name in api:
            key = ('step' if t == tid else f'thread {t}', name)
            per_call[key] += e - s
            per_count[key] += 1
        per_copy = collections.Counter()
        copy_count = collections.Counter()
        for s, e, _, name in cs:
            per_copy[name] += e - s
            copy_count[name] += 1
        steps.append(dict(a=a, b=b, period=b - a, busy=busy, calls=per_call, counts=per_count,
                          copies=per_copy, copy_counts=copy_count, kernels=len(ks)))
    if not steps:
        print('fewer than two steps')
        return 1
    us = 1e-3
    print(f"period {med([s['period'] for s in steps]) * us:.1f} us, GPU busy "
          f"{med([s['busy'] for s in steps]) * us:.1f} us, idle "
          f"{med([s['period'] - s['busy'] for s in steps]) * us:.1f} us, kernels a step "
          f"{med([s['kernels'] for s in steps]):.0f}")
    print('\nruntime calls a step (median host us, count):')
    keys = set().union(*(s['calls'].keys() for s in steps))
    rows = sorted(((med([s['calls'].get(k, 0) for s in steps]) * us, k) for k in keys),
                  reverse=True)
    for t, (who, name) in rows:
        if t < 1.0:
            continue
        c = med([s['counts'].get((who, name), 0) for s in steps])
        print(f'  {t:9.1f}  x{c:<5g} {who}: {name}')
    print('\nmemcpys a step (kind:bytes, median us, count):')
    keys = set().union(*(s['copies'].keys() for s in steps))
    for name in sorted(keys):
        print(f"  {name:24s} {med([s['copies'].get(name, 0) for s in steps]) * us:9.1f}  "
              f"x{med([s['copy_counts'].get(name, 0) for s in steps]):g}")
    print('\nGPU idle gaps > 5 us inside a step, by the kernels around them (a step: count, '
          'total us; median gap us):')
    gaps = collections.defaultdict(list)
    for st in steps:
        acts = sorted([(s, e, n) for s, e, _, n in within(kernels, st['a'], st['b'])] +
                      [(s, e, 'memcpy:' + n) for s, e, _, n in within(copies, st['a'], st['b'])])
        end, last = None, None
        for s, e, n in acts:
            if end is not None and s - end > MERGE_NS:
                gaps[(last[:50], n[:50])].append(s - end)
            if end is None or e > end:
                end, last = e, n
    rows = sorted(gaps.items(), key=lambda kv: -sum(kv[1]))
    for (before, after), g in rows[:15]:
        print(f'  {len(g) / len(steps):6.1f} x {sum(g) / len(steps) * us:8.1f}  '
              f'{statistics.median(g) * us:7.1f}  {before} -> {after}')
    # The median step's timeline.
    order = sorted(steps, key=lambda s: s['period'])
    st = order[len(order) // 2]
    a, b = st['a'], st['b']
    events = []
    for s, e, t, name in within(calls, a, b):
        if t == tid:
            events.append((s, e, f'api {name}'))
    for s, e, stream, name in within(copies, a, b):
        events.append((s, e, f'memcpy {name} (stream {stream})'))
    run = None
    for s, e, stream, name in within(kernels, a, b):
        if run is not None and s <= run[1] + MERGE_NS:
            run = [run[0], max(run[1], e), run[2] + 1, run[3]]
        else:
            if run is not None:
                events.append((run[0], run[1], f'kernels x{run[2]} (first {run[3][:60]})'))
            run = [s, e, 1, name]
    if run is not None:
        events.append((run[0], run[1], f'kernels x{run[2]} (first {run[3][:60]})'))
    events.sort()
    print(f"\nthe median step ({st['period'] * us:.1f} us), offsets from its graph launch, us:")
    shown = 0
    for s, e, what in events:
        if what.startswith('api') and e - s < 2000 and shown > 400:
            continue
        print(f'  {(s - a) * us:9.1f} {(e - s) * us:9.1f}  {what}')
        shown += 1
    return 0


if __name__ == '__main__':
    sys.exit(main(sys.argv))

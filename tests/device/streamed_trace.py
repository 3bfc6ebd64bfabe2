#!/usr/bin/env python3
"""Where the copy engine waits in the streamed-expert prefill (issue 31), from a trace of
tests/device/kernel_trace.cc taken with SS_TRACE_API=1 SS_TRACE_CORR=1 (kernels, memcpys and
runtime calls of the GPU worker, each copy paired with its cudaMemcpyAsync call).

  streamed_trace.py TRACE.csv [MIN_COPY_BYTES]

A streamed step is a run of host -> device copies of at least MIN_COPY_BYTES (default 1 MiB: the
experts' groups) whose gaps are under 60 ms. For each step of at least 20 such copies it prints:
  - the span from the first copy's start to the last copy's end, the copies' busy time and share;
  - the copy engine's idle gaps (> 50 us) split by cause: `host` where the next copy's
    cudaMemcpyAsync was called after the previous copy ended (the host had not enqueued it yet),
    `wait` otherwise (the copy waited for its slot's `free` event: the compute had not released it);
  - the GPU's kernels running during the `wait` gaps (by name, time overlapped), i.e. what the
    copies waited for;
  - the enqueueing thread's runtime calls in the step (count and host time by name) and its calls
    longer than 1 ms (a host stall);
  - the host's lead: how long before its start each copy was enqueued (min / median);
  - the GPU's kernel-busy time in the span (the union of kernel intervals) and the kernel launches'
    host time (median, and the share spent in launches over 1 ms: a full launch queue).
"""

import bisect
import collections
import statistics
import sys

import step_trace  # this folder's decode-step reader: its trace loader and interval union
from step_trace import union

GAP_NS = 50_000
STEP_GAP_NS = 60_000_000


def load(path):
    """step_trace.load's records with each copy's and call's correlation id split off its name."""
    kernels, raw_copies, raw_calls = step_trace.load(path)
    copies, calls, call_list = [], {}, []
    for s, e, stream, name in raw_calls:
        name, _, corr = name.partition('@')
        call_list.append((s, e, stream, name))
        if corr:
            calls[int(corr)] = (s, e, stream, name)
    for s, e, stream, name in raw_copies:
        name, _, corr = name.partition('@')
        kind, nbytes = name.split(':')[:2]
        copies.append((s, e, stream, int(kind), int(nbytes), int(corr) if corr else None))
    return kernels, copies, calls, call_list


def overlap(a0, a1, b0, b1):
    return max(0, min(a1, b1) - max(a0, b0))


def short(name, n=70):
    return name if len(name) <= n else name[:n - 3] + '...'


def report(step, kernels, calls, call_list):
    first, last = step[0][0], max(c[1] for c in step)
    busy = sum(c[1] - c[0] for c in step)
    span = last - first
    print(f'step: {len(step)} copies, {sum(c[4] for c in step) / 1e9:.2f} GB, span {span / 1e6:.1f} ms, '
          f'copies busy {busy / 1e6:.1f} ms ({busy / span:.2f})')
    gaps = {'host': 0, 'wait': 0}
    waits = []
    leads = []
    for prev, cur in zip(step, step[1:]):
        call = calls.get(cur[5])
        if call is not None:
            leads.append(cur[0] - call[0])
        gap = cur[0] - prev[1]
        if gap < GAP_NS:
            continue
        host = 0 if call is None else max(0, min(gap, call[1] - prev[1]))
        gaps['host'] += host
        if gap - host > 0:
            gaps['wait'] += gap - host
            waits.append((prev[1] + host, cur[0]))
    print(f'  idle gaps > {GAP_NS / 1e3:.0f} us: host not yet enqueued {gaps["host"] / 1e6:.1f} ms, '
          f'waiting for a slot {gaps["wait"] / 1e6:.1f} ms ({len(waits)} waits, median '
          f'{statistics.median([b - a for a, b in waits]) / 1e6 if waits else 0:.2f} ms)')
    if leads:
        print(f'  host lead (copy start - its call): min {min(leads) / 1e6:.2f} ms, median '
              f'{statistics.median(leads) / 1e6:.2f} ms')
    by_kernel = collections.Counter()
    i0 = bisect.bisect_left(kernels, (first - 200_000_000,))
    spans = []
    for k in kernels[i0:]:
        if k[0] > last:
            break
        if k[1] > first:
            spans.append((max(k[0], first), min(k[1], last)))
        for a, b in waits:
            by_kernel[k[3]] += overlap(k[0], k[1], a, b)
    gpu = union(spans)
    print(f'  GPU kernels busy {gpu / 1e6:.1f} ms of the span ({gpu / span:.2f}), {len(spans)} kernels')
    wait_total = sum(b - a for a, b in waits)
    if wait_total:
        print('  kernels running during the waits (overlap ms, share of the wait time):')
        for name, t in by_kernel.most_common(12):
            print(f'    {t / 1e6:8.1f} {t / wait_total:5.2f}  {short(name)}')
    # The enqueueing thread: the one that made the step's cudaMemcpyAsync calls.
    threads = collections.Counter(calls[c[5]][2] for c in step if c[5] in calls)
    if not threads:
        return
    tid = threads.most_common(1)[0][0]
    i0 = bisect.bisect_left(call_list, (first - 100_000_000,))
    per = collections.defaultdict(lambda: [0, 0])
    stalls = []
    for c in call_list[i0:]:
        if c[0] > last:
            break
        if c[2] != tid:
            continue
        per[c[3]][0] += 1
        per[c[3]][1] += c[1] - c[0]
        if c[1] - c[0] > 1_000_000:
            stalls.append(c)
    launches = sorted(c[1] - c[0] for c in call_list[i0:] if first <= c[0] <= last and c[2] == tid
                      and c[3].startswith('cudaLaunchKernel'))
    if launches:
        long_t = sum(t for t in launches if t > 1_000_000)
        print(f'  launches in the span: {len(launches)}, median {launches[len(launches) // 2] / 1e3:.1f} us, '
              f'p90 {launches[len(launches) * 9 // 10] / 1e3:.1f} us, total {sum(launches) / 1e6:.1f} ms '
              f'({long_t / 1e6:.1f} ms in calls over 1 ms)')
    print(f'  enqueueing thread {tid}: runtime calls from 100 ms before the first copy to the last copy:')
    for name, (n, t) in sorted(per.items(), key=lambda x: -x[1][1])[:10]:
        print(f'    {name:32s} {n:7d} calls {t / 1e6:9.1f} ms')
    for c in stalls[:12]:
        print(f'    stall: {c[3]} {(c[1] - c[0]) / 1e6:.1f} ms at +{(c[0] - first) / 1e6:.1f} ms')


def main():
    path = sys.argv[1]
    min_bytes = int(sys.argv[2]) if len(sys.argv) > 2 else 1 << 20
    kernels, copies, calls, call_list = load(path)
    h2d = [c for c in copies if c[3] == 1 and c[4] >= min_bytes]
    steps, cur = [], []
    for c in h2d:
        if cur and c[0] - max(x[1] for x in cur[-4:]) > STEP_GAP_NS:
            steps.append(cur)
            cur = []
        cur.append(c)
    if cur:
        steps.append(cur)
    print(f'{len(kernels)} kernels, {len(copies)} copies ({len(h2d)} H2D >= {min_bytes} B), '
          f'{len(call_list)} runtime calls; {len(steps)} runs of copies')
    for s in steps:
        if len(s) >= 20:
            report(s, kernels, calls, call_list)


if __name__ == '__main__':
    main()

#!/usr/bin/env python3
"""Projection of an 8K prefill chunk of DeepSeek-V4-Flash with streamed experts onto RTX 3090s
(issue 31), from what the H200 machine measured. Projected, not measured: print it as such.

Inputs (all from one device session; bench/RESULTS.md, "Projection to RTX 3090s from the measured
counters", has the commands):
  --timeline  tests/device/timeline.sh's output for `--profile_prefill --fp64_sums off`: the
              traced 8K chunk of one ratio-4 and one ratio-128 layer (their spans and kernels).
  --moe-ncu   ncu --csv --page raw of `mxfp4_moe_bench --sm86-smem 8192`, one group's up and down
              GEMM (metrics sm__cycles_elapsed.max, sm__inst_executed_pipe_tensor_op_hmma.sum,
              dram__bytes_read.sum, lts__t_bytes.sum).
  --trunk-ncu (optional) ncu of the layer bench's prefill with the same metrics: the trunk's mma
              counts per launch, for its tensor bound.

A kernel's 3090 time is the largest of
  t_sm     = its H200 cycles x H200 SMs / 82 / 1.695 GHz (the same work a cycle an SM); from a
             traced time, x R with R = 132 x f_H200 / (82 x 1.695 GHz);
  t_tensor = its mma.m16n8k16 count x 32 cycles / (4 x 82 x 1.695 GHz)   (71 TFLOP/s);
  t_dram   = its DRAM bytes / 936 GB/s;
G = the trunk's and the routed experts' times summed, C = layers x layer bytes / PCIe rate. A
chunk's time is not max(C, G): it comes from a simulation of the streamed pipeline as
gpu_worker/cuda/streamed_routed_experts.h runs it (session 30): the ring cut into slots as
PlanRing does (gpu_worker/streamed_prefill.h), the layers in the config's order (ratio 4 and 128
alternating), each layer's trunk then its groups' GEMMs, one after the other; copy i starts when
the copy engine is free and its slot's previous group (i - slots) has computed, at
--copy-efficiency x the PCIe rate (what the H200's copies reached inside the layer loop against
its pinned rate). A layer's attention frees no slot, so a ring smaller than an attention's worth
of copies leaves the copy engine idle. The same simulation, fed the H200's own figures, gives the
measured 4K-chunk step within ~10 % (bench/RESULTS.md, session 30). TP n: a rank's trunk keeps the
replicated kernels whole and a 1/n share of the rest, a 1/n share of the routed experts and of
each expert's bytes, plus the fp32 all-reduces (3 x T x dim values a layer, a ring moving
2(n-1)/n of them a rank) at --allreduce-gbps, not overlapped (part of each layer's trunk).

--sp also prints a DESIGN THAT IS NOT BUILT, sequence-parallel prefill on the same n GPUs: each
rank runs the whole trunk (replicated weights) for T/n of the chunk's tokens (a balanced split
assumed, e.g. zigzag against the indexer's causal cost), streams and computes its 1/n slice of
every expert for all T tokens as under TP, and communicates per layer an all-gather of the MoE
input (T x dim bf16), a reduce-scatter of the routed output (T x dim fp32; the shared expert is
local, so the combine rounds as the reference does) and an all-gather of the new KV records
(--kv-bytes-per-token a layer), each ring moving (n-1)/n of its bytes a rank.
"""
import argparse
import csv
import io
import json
import re

GA102_SMS, GA102_HZ, GA102_DRAM = 82, 1.695e9, 936e9
MMA_CYCLES = 32  # m16n8k16 with fp32 accumulation, per SM sub-partition
REPLICATED = ("LinearBf16F32", "IndexerScores", "IndexerTopK", "Hadamard", "HcCollapse", "HcPost",
              "KvDecodeRows", "RouterLogits", "RouterSelect", "RmsNorm", "Compressor")


def parse_timeline(path):
    """{'ratio4'|'ratio128': {'span': us, 'kernels': {name: [launches, us]}}} of the last steps."""
    spans, steps, cur = {}, {}, None
    for line in open(path):
        m = re.match(r"step (\d+): \d+ kernels, span ([\d.]+) us", line)
        if m:
            spans[m.group(1)] = float(m.group(2))
            continue
        m = re.match(r"--- step (\d+) kernels", line)
        if m:
            cur = m.group(1)
            steps[cur] = {}
            continue
        p = line.split(None, 3)
        if cur and len(p) == 4 and p[2].startswith("s"):
            name = re.sub(r"[<(].*", "", p[3]).replace("void ", "").strip()
            k = steps[cur].setdefault(name, [0, 0.0])
            k[0] += 1
            k[1] += float(p[1])
    out = {}
    for s, kernels in steps.items():
        kind = "ratio4" if any(n.startswith("IndexerScores") for n in kernels) else "ratio128"
        out[kind] = {"span": spans[s], "kernels": kernels}
    return out


def parse_ncu(path):
    lines = [l for l in open(path) if l.startswith('"')]
    rows = list(csv.reader(io.StringIO("".join(lines))))
    hdr, body = rows[0], rows[2:]
    out = []
    for r in body:
        d = {"name": re.sub(r"[<(].*", "", r[hdr.index("Kernel Name")]).replace("void ", "")}
        d["name"] = d["name"].replace("(anonymous namespace)::", "").split("::")[-1].strip()
        for k in ("sm__cycles_elapsed.max", "sm__inst_executed_pipe_tensor_op_hmma.sum",
                  "dram__bytes_read.sum", "lts__t_bytes.sum"):
            d[k] = float(r[hdr.index(k)].replace(",", "")) if k in hdr else 0.0
        out.append(d)
    return out


def t_tensor(mma):
    return mma * MMA_CYCLES / (4 * GA102_SMS * GA102_HZ)


def plan_ring(ring_bytes, expert_bytes, layer_experts, min_slots=4, slot_bytes=256 << 20):
    """gpu_worker/streamed_prefill.cc PlanRing: (experts a slot, slots)."""
    most = ring_bytes // min_slots // expert_bytes
    if most < 1:
        return 0, 0
    per_slot = min(most, layer_experts, max(1, slot_bytes // expert_bytes))
    groups = -(-layer_experts // per_slot)
    return per_slot, min(ring_bytes // (per_slot * expert_bytes), max(min_slots, 2 * groups))


def pipeline(trunk, moe, experts, expert_bytes, ring_bytes, copy_bps):
    """One chunk through the streamed pipeline: trunk[l] and moe[l] seconds per layer, in layer
    order. Returns (seconds, the copies' busy seconds)."""
    per_slot, slots = plan_ring(ring_bytes, int(expert_bytes), experts)
    if slots == 0:
        raise SystemExit(f"a ring of {ring_bytes >> 20} MiB holds no 4 slots of one expert")
    groups = [min(per_slot, experts - e) for e in range(0, experts, per_slot)]
    free = [0.0] * slots
    copy_end = compute = busy = 0.0
    i = 0
    for t, m in zip(trunk, moe):
        compute += t
        for n in groups:
            c = n * expert_bytes / copy_bps
            start = max(copy_end, free[i % slots])
            copy_end = start + c
            busy += c
            compute = max(compute, copy_end) + m * n / experts
            free[i % slots] = compute
            i += 1
    return compute, busy


def main():
    a = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    a.add_argument("--timeline")
    a.add_argument("--moe-ncu")
    a.add_argument("--from-figures", metavar="R4_MS,R128_MS,S4,S128,MOE_MS",
                   help="instead of the files: the 3090 trunk ms of a ratio-4 and a ratio-128 "
                        "layer, their TP shares and the routed experts' ms a layer, as an earlier "
                        "run of this script printed them")
    a.add_argument("--trunk-ncu")
    a.add_argument("--moe-groups", type=int, default=8, help="groups the bench's 256 experts form")
    a.add_argument("--h200-sms", type=int, default=132)
    a.add_argument("--h200-hz", type=float, default=1.98e9, help="the traced run's SM clock")
    a.add_argument("--layers", default="21,20,2", help="ratio-4, ratio-128, window-only layers")
    a.add_argument("--layer-gb", type=float, default=3.43, help="one layer's 256 MXFP4 experts")
    a.add_argument("--pcie-gbps", type=float, default=25.0)
    a.add_argument("--config", default="models/flash/config.json", help="compress_ratios: the order")
    a.add_argument("--experts", type=int, default=256, help="routed experts a layer")
    a.add_argument("--ring-mib", default="1024,2048,3072", help="staging rings to simulate")
    a.add_argument("--copy-efficiency", type=float, default=0.91,
                   help="copy rate inside the layer loop / pinned rate (H200, session 30)")
    a.add_argument("--tp", type=int, default=4)
    a.add_argument("--allreduce-gbps", type=float, default=10.0)
    a.add_argument("--tokens", type=int, default=8192)
    a.add_argument("--dim", type=int, default=4096)
    a.add_argument("--sp", action="store_true", help="also the sequence-parallel design (above)")
    a.add_argument("--kv-bytes-per-token", type=float, default=449824 / 128 / 43,
                   help="a layer's KV record bytes a token (the memory plan's Flash block / 43)")
    o = a.parse_args()
    r = o.h200_sms * o.h200_hz / (GA102_SMS * GA102_HZ)
    n4, n128, nswa = (int(x) for x in o.layers.split(","))
    layers = n4 + n128 + nswa
    if o.from_figures:
        r4, r128, s4, s128, moe_ms = (float(x) for x in o.from_figures.split(","))
        trunk = {"ratio4": (r4 * 1e-3, 0.0, s4), "ratio128": (r128 * 1e-3, 0.0, s128)}
        project(o, trunk, moe_ms * 1e-3, layers, {"ratio4": n4, "ratio128": n128 + nswa})
        return
    if not (o.timeline and o.moe_ncu):
        raise SystemExit("--timeline and --moe-ncu, or --from-figures")
    tl = parse_timeline(o.timeline)
    mma_per_launch = {}
    if o.trunk_ncu:
        for d in parse_ncu(o.trunk_ncu):
            c = mma_per_launch.setdefault(d["name"], [0, 0.0])
            c[0] += 1
            c[1] += d["sm__inst_executed_pipe_tensor_op_hmma.sum"]
    print(f"R = {o.h200_sms} x {o.h200_hz / 1e9:.2f} GHz / ({GA102_SMS} x {GA102_HZ / 1e9:.3f} GHz)"
          f" = {r:.2f}")
    trunk = {}
    for kind in ("ratio4", "ratio128"):
        k = tl[kind]
        mma = sum(n * mma_per_launch[name][1] / mma_per_launch[name][0]
                  for name, (n, _) in k["kernels"].items() if name in mma_per_launch)
        total = sum(us for _, us in k["kernels"].values())
        repl = sum(us for name, (_, us) in k["kernels"].items() if name.startswith(REPLICATED))
        tp_share = (repl + (total - repl) / o.tp) / total
        trunk[kind] = (max(k["span"] * 1e-6 * r, t_tensor(mma)), k["span"] * 1e-6, tp_share)
        print(f"{kind}: span {k['span'] / 1e3:.1f} ms (kernels {total / 1e3:.1f} ms, replicated "
              f"under TP {repl / 1e3:.1f}); 3090: t_sm {k['span'] * 1e-3 * r:.1f} ms, t_tensor "
              f"{t_tensor(mma) * 1e3:.1f} ms{'' if mma else ' (no trunk ncu)'}; "
              f"a TP {o.tp} rank's share {tp_share:.2f}")
    counts = {"ratio4": n4, "ratio128": n128 + nswa}
    moe = parse_ncu(o.moe_ncu)
    cyc = sum(d["sm__cycles_elapsed.max"] for d in moe) * o.moe_groups
    mma = sum(d["sm__inst_executed_pipe_tensor_op_hmma.sum"] for d in moe) * o.moe_groups
    dram = sum(d["dram__bytes_read.sum"] for d in moe) * o.moe_groups
    l2 = sum(d["lts__t_bytes.sum"] for d in moe) * o.moe_groups
    t_sm = cyc * o.h200_sms / GA102_SMS / GA102_HZ
    moe_layer = max(t_sm, t_tensor(mma), dram / GA102_DRAM)
    print(f"routed experts a layer: t_sm {t_sm * 1e3:.1f} ms ({cyc / 1e6:.1f} M H200 cycles), "
          f"t_tensor {t_tensor(mma) * 1e3:.1f} ms, t_dram {dram / GA102_DRAM * 1e3:.1f} ms "
          f"({l2 / GA102_DRAM * 1e3:.0f} ms with no L2 hits)")
    project(o, trunk, moe_layer, layers, counts)


def project(o, trunk, moe_layer, layers, counts):
    """The 3090 chunk times from trunk[kind] = (3090 s, H200 s, TP share) and a layer's routed
    experts' 3090 seconds."""
    trunk_h200 = sum(counts[k] * trunk[k][1] for k in trunk)
    trunk_3090 = sum(counts[k] * trunk[k][0] for k in trunk)
    trunk_tp = sum(counts[k] * trunk[k][0] * trunk[k][2] for k in trunk)
    routed = layers * moe_layer
    g1 = trunk_3090 + routed
    c1 = layers * o.layer_gb / o.pcie_gbps
    h200 = f"H200 {trunk_h200:.2f} s -> " if trunk_h200 else ""
    print(f"trunk: {h200}3090 {trunk_3090:.2f} s; routed {routed:.2f} s; G {g1:.2f} s; C {c1:.2f} s")
    ratios = json.load(open(o.config))["compress_ratios"][:layers]
    kinds = ["ratio4" if r == 4 else "ratio128" for r in ratios]
    expert_bytes = o.layer_gb * 1e9 / o.experts
    copy_bps = o.pcie_gbps * 1e9 * o.copy_efficiency
    ar = layers * 2 * (o.tp - 1) / o.tp * 3 * o.tokens * o.dim * 4 / (o.allreduce_gbps * 1e9)
    for ring in (int(x) << 20 for x in o.ring_mib.split(",")):
        t1, busy = pipeline([trunk[k][0] for k in kinds], [moe_layer] * layers, o.experts,
                            expert_bytes, ring, copy_bps)
        print(f"ring {ring >> 20} MiB: 1x RTX 3090: {t1:.2f} s a chunk ({t1 / max(c1, g1):.3f} x "
              f"max(C, G), copies busy {busy / t1:.2f}): {o.tokens / t1:,.0f} tok/s "
              f"({o.tokens / max(c1, g1):,.0f} with full overlap)")
        t_tp, _ = pipeline([trunk[k][0] * trunk[k][2] + ar / layers for k in kinds],
                           [moe_layer / o.tp] * layers, o.experts, expert_bytes / o.tp, ring,
                           copy_bps)
        t_no, _ = pipeline([trunk[k][0] * trunk[k][2] for k in kinds],
                           [moe_layer / o.tp] * layers, o.experts, expert_bytes / o.tp, ring,
                           copy_bps)
        print(f"  {o.tp}x RTX 3090, TP {o.tp}: trunk {trunk_tp:.2f} + routed {routed / o.tp:.2f} + "
              f"all-reduce {ar:.2f} s, C {c1 / o.tp:.2f} s: {t_tp:.2f} s a chunk, "
              f"{o.tokens / t_tp:,.0f} tok/s ({o.tokens / t_no:,.0f} without the all-reduces)")
        if o.sp:
            n = o.tp
            sp_bytes = (n - 1) / n * o.tokens * (o.dim * (2 + 4) + o.kv_bytes_per_token)
            comm = layers * sp_bytes / (o.allreduce_gbps * 1e9)
            t_sp, _ = pipeline([trunk[k][0] / n + comm / layers for k in kinds],
                               [moe_layer / n] * layers, o.experts, expert_bytes / n, ring,
                               copy_bps)
            print(f"  {n}x RTX 3090, sequence-parallel (a design, not built): trunk "
                  f"{trunk_3090 / n:.2f} + routed {routed / n:.2f} + all-gathers and "
                  f"reduce-scatters {comm:.2f} s, C {c1 / n:.2f} s: {t_sp:.2f} s a chunk, "
                  f"{o.tokens / t_sp:,.0f} tok/s")


if __name__ == "__main__":
    main()

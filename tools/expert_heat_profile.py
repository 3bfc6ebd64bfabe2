#!/usr/bin/env python3
"""Writes the routed experts' routing counts of running GPU workers as a profile for
--gpu-experts-profile (gpu_worker/expert_placement.h's JSON).

Reads splitserve:gpu_worker_expert_routed_total{layer, expert, worker} from each /metrics URL given
(one per GPU worker; a TP group's ranks count the same choices, so give one rank of each stage),
adds the counts of equal (layer, expert) pairs and prints the profile:

  tools/expert_heat_profile.py http://127.0.0.1:8001/metrics [URL ...] > heat.json
  splitserve up ... --gpu-experts 0.25 --gpu-experts-profile heat.json
"""

import json
import re
import sys
import urllib.request

SERIES = re.compile(r'^splitserve:gpu_worker_expert_routed_total\{([^}]*)\} ([0-9.eE+]+)$')
LABEL = re.compile(r'(\w+)="([^"]*)"')


def main(urls):
    if not urls:
        print(__doc__, file=sys.stderr)
        return 2
    counts = {}  # layer -> expert -> count
    for url in urls:
        with urllib.request.urlopen(url, timeout=30) as r:
            text = r.read().decode()
        for line in text.splitlines():
            m = SERIES.match(line)
            if not m:
                continue
            labels = dict(LABEL.findall(m.group(1)))
            layer, expert = int(labels["layer"]), int(labels["expert"])
            counts.setdefault(layer, {})[expert] = (
                counts.get(layer, {}).get(expert, 0) + int(float(m.group(2))))
    if not counts:
        print("no splitserve:gpu_worker_expert_routed_total series at " + " ".join(urls),
              file=sys.stderr)
        return 1
    n_experts = 1 + max(e for per in counts.values() for e in per)
    layers = {str(l): [per.get(e, 0) for e in range(n_experts)] for l, per in sorted(counts.items())}
    json.dump({"format": "splitserve-expert-heat", "version": 1, "n_experts": n_experts,
               "layers": layers}, sys.stdout)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

#!/usr/bin/env python3
"""A conversation's follow-up turn against the prefix cache (issue 26), on a running server.

  python3 bench/prefix_followup.py PORT MODEL_ID CONTEXT NEW [--seed S] [--ids LO HI]

Streams four /v1/completions requests of random token ids (max_tokens 1) one after another and
prints the time to first token (TTFT) and usage.prompt_tokens_details.cached_tokens of each:
  alone     NEW fresh ids (what the new tokens cost without any context)
  turn 1    CONTEXT fresh ids (the conversation so far)
  turn 2    the same CONTEXT ids + NEW more (the follow-up: served from the cache up to the last
            block boundary of turn 1)
  control   turn 2's length with another first id (nothing cached: the follow-up from scratch)
"""
import argparse
import json
import random
import time
import urllib.request


def stream(port, model, prompt):
    body = {"model": model, "prompt": prompt, "max_tokens": 1, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions",
                                 data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    t0 = time.monotonic()
    ttft, usage = None, {}
    with urllib.request.urlopen(req, timeout=900) as r:
        for raw in r:
            line = raw.decode().strip()
            if not line.startswith("data: {"):
                continue
            event = json.loads(line[6:])
            if ttft is None and event.get("choices"):
                ttft = time.monotonic() - t0
            if event.get("usage"):
                usage = event["usage"]
    return ttft or float("nan"), usage.get("prompt_tokens_details", {}).get("cached_tokens", -1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("port", type=int)
    ap.add_argument("model")
    ap.add_argument("context", type=int)
    ap.add_argument("new", type=int)
    ap.add_argument("--seed", type=int, default=26)
    ap.add_argument("--ids", type=int, nargs=2, default=[1000, 100000],
                    help="token ids are drawn from [LO, HI) (default: ordinary ids of DeepSeek-V4)")
    a = ap.parse_args()
    rng = random.Random(a.seed)
    draw = lambda n: [rng.randrange(a.ids[0], a.ids[1]) for _ in range(n)]
    context, new = draw(a.context), draw(a.new)
    runs = [("alone", draw(a.new)), ("turn 1", context), ("turn 2", context + new),
            ("control", [a.ids[0] + (context[0] - a.ids[0] + 1) % (a.ids[1] - a.ids[0])] +
             context[1:] + new)]
    got = {}
    for name, prompt in runs:
        ttft, cached = stream(a.port, a.model, prompt)
        got[name] = ttft
        print(f"prefix follow-up: {name}: {len(prompt)} tokens, TTFT {ttft:.3f} s, cached {cached}")
    print(f"prefix follow-up: turn 2 / turn 1 TTFT {got['turn 2'] / got['turn 1']:.3f}; "
          f"turn 2 / control {got['turn 2'] / got['control']:.3f}; "
          f"turn 2 / the {a.new} new tokens alone {got['turn 2'] / got['alone']:.2f}")


if __name__ == "__main__":
    main()

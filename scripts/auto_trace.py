#!/usr/bin/env python3
"""Where does auto mode's time go, cycle by cycle, against plain decoding?

For each prompt this runs plain and auto (alternating which goes first), then
splits auto's decode time by the kind of cycle (plain, a chosen drafter, a
probe) and prices each kind against the same run's plain decoding: a cycle
"costs" its time minus what plain decoding takes for the tokens it produced
(the median plain cycle of the plain run times its tokens). A negative cost is
time saved. What auto loses where it drafts little shows up here as probes,
catch-up and per-cycle work.

    .venv/bin/python scripts/auto_trace.py [--category free-form] [--max-tokens 128] [--repeats 2]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import defaultdict

from edgespec.bench import load_prompts, machine, rotation
from edgespec.chat.prompt import encode_prompt
from edgespec.cli.options import add_model_options, engine_from_args
from edgespec.engine.events import GenerationParams


def cycles(engine, tokens, params):
    """[(kind, drafter, tokens, seconds)] per cycle, and the stats."""
    out, last, stamp = [], None, None
    for chunk in engine.generate(tokens, params):
        now = time.perf_counter()
        stats = chunk.stats
        if stamp is None:  # the first cycle: from the end of prompt processing
            stamp = now - stats.decode_s
        out.append((stats.plan_kind, stats.drafter, len(chunk.tokens), now - stamp))
        stamp, last = now, chunk
    return out, last.stats


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_options(parser)
    parser.add_argument("--category", action="append")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    with engine_from_args(args) as engine:
        print(f"{machine()}; exact kernels: {engine.describe().exact}")
        engine.auto(GenerationParams(mode="auto"))  # calibrated now: a first run's calibration is no cycle's
        for prompt in load_prompts(categories=args.category):
            tokens = encode_prompt(engine, prompt.prompt).tokens
            cost, total, ratios = defaultdict(float), defaultdict(int), []
            for r in range(args.repeats):
                runs = {}
                for mode in rotation(("plain", "auto"), r):
                    runs[mode] = cycles(engine, tokens, GenerationParams(mode=mode, max_tokens=args.max_tokens))
                plain_cycle = statistics.median(s for _, _, n, s in runs["plain"][0] if n == 1)
                ratios.append(runs["auto"][1].tokens_per_s / runs["plain"][1].tokens_per_s)
                for kind, drafter, n, s in runs["auto"][0]:
                    key = f"{kind} {drafter}" if kind != "plain" else "plain"
                    cost[key] += s - n * plain_cycle
                    total[key] += 1
                plain_s = runs["plain"][1].decode_s
            parts = ", ".join(f"{key}: {total[key] // args.repeats} cycles, {cost[key] / args.repeats / plain_s:+.1%}"
                              for key in sorted(total))
            print(f"{prompt.id:<16} auto/plain {statistics.median(ratios):.2f}x  ({parts}; of plain time)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

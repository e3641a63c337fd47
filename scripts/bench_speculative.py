#!/usr/bin/env python3
"""Plain vs speculative decoding (draft model, prompt lookup, auto), side by side.

Runs a handful of prompts from the shipped suite on the bundled Qwen2.5-Coder
1.5B / 0.5B pair (or --target/--draft), every mode back to back per repeat,
and prints tokens/s, acceptance and speedup over plain. It also splits each
run's wall time into time inside llama_decode (target and draft) and the rest:
the per-cycle overhead of edgespec's Python loop.

    .venv/bin/python scripts/bench_speculative.py [--repeats 2] [--max-tokens 96] [--k 4]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from edgespec.bench import load_prompts  # noqa: E402
from edgespec.chat.template import encode_prompt  # noqa: E402
from edgespec.cli.options import add_model_options, engine_from_args  # noqa: E402
from edgespec.engine.events import GenerationParams  # noqa: E402

PROMPT_IDS = ("explain", "write-function", "add-docstrings", "reformat-json")


def run(engine, tokens, params):
    """One generation: its tokens, stats, wall seconds, and seconds inside llama_decode."""
    contexts = [seq.ctx for seq in (engine.target_seq, engine.draft_seq) if seq is not None]
    in_llama = sum(c.decode_s for c in contexts)
    start = time.perf_counter()
    out, last = [], None
    for last in engine.generate(tokens, params):
        out += last.tokens
    wall = time.perf_counter() - start
    return out, last.stats, wall, sum(c.decode_s for c in contexts) - in_llama


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_options(parser)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--modes", default="plain,draft,lookup,auto")
    args = parser.parse_args()
    modes = args.modes.split(",")
    prompts = [p for p in load_prompts() if p.id in PROMPT_IDS]

    with engine_from_args(args) as engine:
        print(f"models: {', '.join(Path(m['path']).name for m in engine.describe()['models'].values())}; "
              f"k={args.k}, max_tokens={args.max_tokens}, greedy, {args.repeats} repeats, modes interleaved")
        print(f"{'prompt':<15} {'mode':<7} {'tok/s':>7} {'speedup':>8} {'accept':>7} {'tok/pass':>8} "
              f"{'overhead/cycle':>15} {'same':>5}")
        overheads, passes = [], []
        for prompt in prompts:
            tokens = encode_prompt(engine, prompt.prompt)[0]
            run(engine, tokens, GenerationParams(mode="plain", max_tokens=8))  # warm-up
            rows = {m: [] for m in modes}
            for r in range(args.repeats):
                order = modes[r % len(modes):] + modes[: r % len(modes)]
                results = {m: run(engine, tokens, GenerationParams(mode=m, k=args.k, max_tokens=args.max_tokens))
                           for m in order}
                for m, res in results.items():
                    rows[m].append((res, results["plain"]))
            for m in modes:
                tps = statistics.median(res[1].tokens_per_s for res, _ in rows[m])
                speedup = statistics.median(res[1].tokens_per_s / plain[1].tokens_per_s for res, plain in rows[m])
                stats = rows[m][-1][0][1]
                acc = f"{stats.acceptance_rate:.0%}" if stats.drafted else "-"
                # Python's share: wall time not spent in llama_decode, per target pass.
                per_cycle = statistics.median((res[2] - res[3]) / res[1].target_passes for res, _ in rows[m])
                pass_s = statistics.median(res[3] / res[1].target_passes for res, _ in rows[m])
                overheads.append(per_cycle)
                passes.append(pass_s)
                same = all(res[0] == plain[0] for res, plain in rows[m])
                print(f"{prompt.id:<15} {m:<7} {tps:>7.1f} {speedup:>7.2f}x {acc:>7} {stats.tokens_per_pass:>8.2f} "
                      f"{per_cycle * 1000:>12.2f} ms {'yes' if same else 'NO':>5}", flush=True)
        print(f"\nPython overhead per cycle (median over runs): {statistics.median(overheads) * 1000:.2f} ms; "
              f"llama_decode time per cycle: {statistics.median(passes) * 1000:.1f} ms "
              f"({statistics.median(overheads) / statistics.median(passes):.1%} of it)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""How much faster could speculation be on these prompts, on this machine?

For each prompt of the shipped suite this generates the plain greedy reply,
then records at every position of it what the draft model guesses and how
sure it is (the draft reads the reply under teacher forcing), and measures
the costs: a target pass over 1..K+1 tokens, one draft-model token and its
catch-up per token. With those it replays (edgespec/engine/replay.py), free
of machine noise:

- draft k, lookup k: the fixed modes;
- auto: edgespec's AutoPolicy, making its choices from what it has seen so far
  (one policy for the whole suite, as in the app);
- ceiling: the fastest schedule any policy choosing plain, lookup (k <= K) or
  the draft model (k <= K) each cycle could reach if it knew in advance which
  guesses the target will accept.

    .venv/bin/python scripts/speculation_ceiling.py [--max-tokens 96] [--category grounded]
    .venv/bin/python scripts/speculation_ceiling.py --save-traces tests/data/bundled_traces.json

--save-traces writes the recorded replies and guesses (no timings) for the
tests, which replay auto mode on them under several machines' costs.
"""

from __future__ import annotations

import argparse
import sys

from edgespec.bench import load_prompts
from edgespec.chat.prompt import encode_prompt
from edgespec.cli.options import add_model_options, engine_from_args
from edgespec.engine.auto import AutoPolicy
from edgespec.engine.costs import Costs, measure_pass
from edgespec.engine.policy import FixedPolicy
from edgespec.engine.drafters import PromptLookup
from edgespec.engine.events import GenerationParams
from edgespec.engine.replay import (
    ReplayedDraft, Trace, ceiling, plain_seconds, replay, save_traces,
)
from edgespec.engine.choice import ACCEPTANCE_PRIORS
from edgespec.engine.sampling import greedy, top_probability


def record(engine, name: str, prompt: list[int], max_tokens: int) -> Trace:
    reply: list[int] = []
    for chunk in engine.generate(prompt, GenerationParams(mode="plain", max_tokens=max_tokens)):
        reply += chunk.tokens
    seq = engine.draft_seq
    seq.sync(prompt[:-1])
    seq.extend([prompt[-1], *reply[:-1]], all_logits=True)
    rows = [seq.logits(i) for i in range(len(reply))]
    guess, confidence = [greedy(r) for r in rows], [round(top_probability(r), 4) for r in rows]
    seq.truncate(len(prompt) - 1)
    return Trace(name, list(prompt), reply, guess, confidence)


def measure_costs(engine, prompt: list[int], k_max: int) -> Costs:
    target = engine.target_seq
    target.sync(prompt[:-1])
    passes = {n: measure_pass(target, n, repeats=3) for n in range(1, k_max + 2)}
    draft = engine.draft_seq
    draft.sync(prompt[:-1])
    return Costs(passes, {"lookup": 0.0, "draft": measure_pass(draft, 1, repeats=3)},
                 {"draft": measure_pass(draft, 16, repeats=2) / 16})


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_options(parser)
    parser.add_argument("--category", action="append", help="only these categories (repeatable)")
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--k", type=int, default=8, help="k of the fixed modes and auto (as edgespec bench)")
    parser.add_argument("--save-traces", metavar="FILE", help="also write the recorded traces (JSON) here")
    args = parser.parse_args()

    with engine_from_args(args) as engine:
        if not engine.has_draft:
            sys.exit("this needs a draft model")
        k_max = min(engine.max_verify_batch() - 1, 16)
        k = min(args.k, k_max)
        prompts = load_prompts(categories=args.category)
        encoded = [(p, encode_prompt(engine, p.prompt)[0]) for p in prompts]
        costs = measure_costs(engine, encoded[0][1], k_max)
        print("costs: target pass " + ", ".join(f"{n}: {s * 1000:.0f} ms" for n, s in sorted(costs.target.items()))
              + f"; draft token {costs.per_draft_token['draft'] * 1000:.1f} ms, catch-up "
              f"{costs.per_catch_up_token['draft'] * 1000:.1f} ms a token; longest verify k = {k_max}")
        print(f"{'prompt':<16} {'category':<10} {'agree':>6} {'draft k' + str(k):>9} {'lookup k' + str(k):>9} "
              f"{'auto':>6} {'ceiling':>8}   (agree: the draft model's greedy guess is the target's; "
              f"then speedup over plain, replayed)")
        draft, lookup = ReplayedDraft(costs), PromptLookup()
        auto = AutoPolicy(costs, [lookup, draft], k_max=k, priors=ACCEPTANCE_PRIORS)
        traces = []
        for prompt, tokens in encoded:
            trace = record(engine, prompt.id, tokens, args.max_tokens)
            traces.append(trace)
            plain = plain_seconds(trace, costs)
            row = [
                replay(FixedPolicy(draft, k), trace, costs, draft),
                replay(FixedPolicy(lookup, k), trace, costs, draft),
                replay(auto, trace, costs, draft),
                ceiling(trace, costs, k_max, lookup),
            ]
            agree = sum(g == r for g, r in zip(trace.guess, trace.reply)) / len(trace.reply)
            print(f"{prompt.id:<16} {prompt.category:<10} {agree:>6.0%} "
                  + " ".join(f"{plain / s:>8.2f}x" for s in row[:2])
                  + f" {plain / row[2]:>5.2f}x {plain / row[3]:>7.2f}x", flush=True)
        if args.save_traces:
            save_traces(traces, args.save_traces)
            print(f"wrote {args.save_traces}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

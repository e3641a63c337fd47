#!/usr/bin/env python3
"""How much faster could speculation be on these prompts, on this machine?

For each prompt of the suite this generates the plain greedy reply, then
records at every position of it what the draft model guesses and how sure it
and the target are (both read the reply under teacher forcing), and measures the costs:
a target pass over 1..K+1 tokens, one draft-model token and its catch-up per
token. With those it replays (edgespec/engine/replay.py), free of machine
noise, and prints for each prompt its speedup over plain decoding:

- auto: edgespec's AutoPolicy, making its choices from what it has seen so far
  (one policy for the whole suite, as in the app);
- best fixed: the fastest of plain, draft k and lookup k (k <= --k) for that
  prompt, chosen in hindsight (and under the suite's figures, the one setting
  fastest over the whole suite: what the best `--mode M --k K` gives every reply);
- ceiling: the fastest schedule any policy choosing plain, lookup or the draft
  model (k <= --k) each cycle could reach if it knew in advance which guesses
  the target will accept.

    .venv/bin/python scripts/speculation_ceiling.py [--max-tokens 96] [--category grounded] [--prompts FILE]
    .venv/bin/python scripts/speculation_ceiling.py --save-traces tests/data/bundled_traces.json
    .venv/bin/python scripts/speculation_ceiling.py --traces tests/data/bundled_traces.json --machine all [--json]
    .venv/bin/python scripts/speculation_ceiling.py --traces tests/data/bundled_traces.json \
        --traces tests/data/dev_traces.json --machine all --orders 3 --first-replies [--charge-warming]

--save-traces writes the recorded replies and guesses (no timings) for the
tests, which replay auto mode on them under several machines' costs;
--traces replays such files instead of recording (no model is loaded), and
--machine replays under the cost profiles of the tests (replay.MACHINES) in
place of this machine's. --orders N replays the suite in N orders (auto carries
what it learnt from reply to reply, so one order can flatter or wrong a change),
--charge-warming charges the draft model's reading of each prompt (as the
engine pays it and the tests replay it), --read-ahead N replays the chat app's
reading of each prompt while it is written (all but its last N tokens, before
the reply: Engine.read), --first-replies adds the figures of
each reply replayed as a session's first, and --json prints the same figures as
JSON. To judge a change to auto, replay the development suite
(tests/data/dev_traces.json) with the tests' one, in several orders and as first
replies, both with and without --charge-warming.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import statistics
import sys

from edgespec.bench import load_prompts
from edgespec.chat.prompt import encode_prompt
from edgespec.cli.options import add_model_options, engine_from_args
from edgespec.engine.costs import Costs, measure_pass
from edgespec.engine.events import GenerationParams
from edgespec.limits import LIMITS
from edgespec.engine.replay import (
    MACHINES, SuiteRow, Trace, best_setting, load_traces, machine_costs, replay_auto, replay_suite, save_traces,
)
from edgespec.engine.sampling import greedy, top_probability


def record(engine, name: str, prompt: list[int], max_tokens: int) -> Trace:
    reply: list[int] = []
    for chunk in engine.generate(prompt, GenerationParams(mode="plain", max_tokens=max_tokens)):
        reply += chunk.tokens
    rows = read_along(engine.draft_seq, prompt, reply)
    guess, confidence = [greedy(r) for r in rows], [round(top_probability(r), 4) for r in rows]
    target_confidence = [round(top_probability(r), 4) for r in read_along(engine.target_seq, prompt, reply)]
    return Trace(name, list(prompt), reply, guess, confidence, target_confidence)


def read_along(seq, prompt: list[int], reply: list[int]) -> list:
    """The model's logits for each reply position, having read all before it (teacher
    forcing); the sequence is left holding the prompt but its last token."""
    seq.sync(prompt[:-1])
    seq.extend([prompt[-1], *reply[:-1]], all_logits=True)
    rows = [seq.logits(i) for i in range(len(reply))]
    seq.truncate(len(prompt) - 1)
    return rows


def measure_costs(engine, prompt: list[int], k_max: int) -> Costs:
    target = engine.target_seq
    target.sync(prompt[:-1])
    passes = {n: measure_pass(target, n, repeats=3) for n in range(1, k_max + 2)}
    draft = engine.draft_seq
    draft.sync(prompt[:-1])
    return Costs(passes, {"lookup": 0.0, "draft": measure_pass(draft, 1, repeats=3)},
                 {"draft": measure_pass(draft, 16, repeats=2) / 16})


def read_traces(path: str) -> list[Trace]:
    """The traces `path` holds (--save-traces wrote them), or the script ends saying which it cannot read."""
    try:
        return load_traces(path)
    except (OSError, ValueError, TypeError, KeyError) as e:
        sys.exit(f"cannot read traces from {path}: {e}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_options(parser)
    parser.add_argument("--prompts", metavar="FILE", help="a prompt suite of the shipped suite's YAML shape")
    parser.add_argument("--category", action="append", help="only these categories (repeatable)")
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--k", type=int, default=LIMITS["k"].default,
                        help="most tokens a cycle drafts, for auto, the fixed modes and the ceiling")
    parser.add_argument("--save-traces", metavar="FILE", help="also write the recorded traces (JSON) here")
    parser.add_argument("--traces", metavar="FILE", action="append",
                        help="replay these recorded traces (no model is loaded; repeatable: one suite, in order)")
    parser.add_argument("--machine", action="append", choices=[*MACHINES, "all"],
                        help="replay under this cost profile of the tests (repeatable; all: every one)")
    parser.add_argument("--orders", type=int, default=1, metavar="N",
                        help="also replay the suite in N - 1 shuffled orders (auto's choices depend on the "
                             "replies before) and give the suite's figures in each")
    parser.add_argument("--first-replies", action="store_true",
                        help="also replay each reply as a session's first (nothing learnt or carried) "
                             "and give the suite's figures then")
    parser.add_argument("--charge-warming", action="store_true",
                        help="charge the draft model's reading of each prompt (auto and fixed modes alike)")
    parser.add_argument("--read-ahead", type=int, metavar="N",
                        help="replay the chat's reading ahead: each prompt read into the models while it is "
                             "written, all but its last N tokens (the word being written and the template's "
                             "tail: 8 or so), on no reply's clock; auto and fixed modes alike")
    parser.add_argument("--json", action="store_true", help="print JSON instead of tables")
    args = parser.parse_args()

    prompts = load_prompts(args.prompts, categories=args.category)
    categories = {p.id: p.category for p in prompts}
    if args.traces:
        traces = [t for path in args.traces for t in read_traces(path)
                  if t.name in categories or not args.category]
        measured = None
    else:
        traces, measured = record_suite(args, prompts)
    machines = [*MACHINES] if args.machine and "all" in args.machine else args.machine or []
    if measured is None and not machines:
        sys.exit("--traces needs --machine: recorded traces hold no timings")
    reports = ([("this machine", measured)] if measured else []) + [(m, machine_costs(m)) for m in machines]
    results = [(name, costs, replay_orders(traces, costs, args)) for name, costs in reports]
    firsts = [first_replies(traces, runs[0], costs, args) if args.first_replies else None
              for _, costs, runs in results]
    if args.json:
        print(json.dumps([as_json(name, costs, runs, categories, args.k, first)
                          for (name, costs, runs), first in zip(results, firsts)], indent=1))
    else:
        for (name, costs, runs), first in zip(results, firsts):
            print_table(name, costs, runs, {t.name: t for t in traces}, categories, first)
    return 0


def replay_orders(traces: list[Trace], costs: Costs, args) -> list[list[SuiteRow]]:
    """The suite's rows in the order given, then in args.orders - 1 shuffles of it (seeds
    1, 2, ...: the same on every run). Only auto depends on the order: the best fixed
    modes and the ceiling are replayed once."""
    rows = replay_suite(traces, costs, args.k, charge_warming=args.charge_warming, read_ahead_but=args.read_ahead)
    runs = [rows]
    for seed in range(1, max(args.orders, 1)):
        order = list(range(len(traces)))
        random.Random(seed).shuffle(order)
        seconds = replay_auto([traces[i] for i in order], costs, args.k, charge_warming=args.charge_warming,
                              read_ahead_but=args.read_ahead)
        runs.append([dataclasses.replace(rows[i], auto_s=auto_s) for i, auto_s in zip(order, seconds)])
    return runs


def first_replies(traces: list[Trace], rows: list[SuiteRow], costs: Costs, args) -> list[SuiteRow]:
    """`rows` with auto's seconds for each reply replayed alone, as a session's first: the
    priors, no reply length seen yet, nothing carried (what a short edit in a new
    session pays for a draft model read for nothing)."""
    return [dataclasses.replace(row, auto_s=replay_auto([trace], costs, args.k, charge_warming=args.charge_warming,
                                                        read_ahead_but=args.read_ahead)[0])
            for trace, row in zip(traces, rows)]


def record_suite(args, prompts) -> tuple[list[Trace], Costs]:
    """The plain greedy reply and the draft model's guesses along it for each
    prompt, and this machine's costs."""
    with engine_from_args(args) as engine:
        if not engine.has_draft:
            sys.exit("this needs a draft model")
        k_max = min(engine.max_verify_batch() - 1, 16)
        encoded = [(p, encode_prompt(engine, p.prompt).tokens) for p in prompts]
        costs = measure_costs(engine, encoded[0][1], k_max)
        traces = [record(engine, prompt.id, tokens, args.max_tokens) for prompt, tokens in encoded]
    if args.save_traces:
        save_traces(traces, args.save_traces)
        print(f"wrote {args.save_traces}", file=sys.stderr)
    return traces, costs


def suite(rows: list[SuiteRow]) -> dict[str, float | str | int]:
    """Speedups over the whole suite (its seconds summed): auto's, the best fixed mode's
    for each reply (and with the luck of one k taken out: SuiteRow.steady), the one
    setting's best for them all (best_setting), the ceiling's; and the worst reply's
    auto / best fixed (and / the steady best)."""
    plain = sum(r.plain_s for r in rows)
    (mode, k), setting_s = best_setting(rows)
    return {"auto": plain / sum(r.auto_s for r in rows), "best_fixed": plain / sum(r.fixed_s for r in rows),
            "best_fixed_steady": plain / sum(r.steady_s for r in rows),
            "best_setting": plain / setting_s, "best_setting_mode": mode, "best_setting_k": k,
            "ceiling": plain / sum(r.ceiling_s for r in rows),
            "worst_auto_over_best_fixed": min(r.auto / r.fixed for r in rows),
            "worst_auto_over_best_fixed_steady": min(r.auto / r.steady for r in rows),
            "slowest_auto": min(r.auto for r in rows)}


def as_json(name: str, costs: Costs, runs: list[list[SuiteRow]], categories: dict[str, str], k: int,
            first: list[SuiteRow] | None = None) -> dict:
    """The suite in the order given (its prompts and figures), the figures of every order
    replayed, and (`first`) those of each reply replayed as a session's first."""
    rows = runs[0]
    return {"machine": name, "k": min(k, max(costs.target) - 1), "suite": suite(rows),
            "orders": [suite(order) for order in runs], **({"first_replies": suite(first)} if first else {}),
            "prompts": [
        {"id": r.name, "category": categories.get(r.name, ""), "plain_s": r.plain_s, "auto": r.auto,
         "best_fixed": r.fixed, "best_fixed_mode": r.fixed_mode, "best_fixed_k": r.fixed_k, "best_fixed_steady": r.steady,
         "ceiling": r.ceiling}
        for r in rows]}


def print_table(name: str, costs: Costs, runs: list[list[SuiteRow]], traces: dict[str, Trace],
                categories: dict[str, str], first: list[SuiteRow] | None = None) -> None:
    rows = runs[0]
    draft = costs.per_draft_token.get("draft", 0.0)
    print(f"{name}: target pass " + ", ".join(f"{n}: {s * 1000:.0f} ms" for n, s in sorted(costs.target.items()))
          + f"; draft token {draft * 1000:.1f} ms, catch-up "
          f"{costs.per_catch_up_token.get('draft', 0.0) * 1000:.1f} ms a token")
    print(f"{'prompt':<16} {'category':<10} {'agree':>6} {'plain s':>8} {'auto':>6} {'best fixed':>18} "
          f"{'ceiling':>8}   (agree: the draft model's greedy guess is the target's; then speedup over plain)")
    for r in rows:
        trace = traces[r.name]
        agree = sum(g == t for g, t in zip(trace.guess, trace.reply)) / max(len(trace.reply), 1)
        fixed = f"{r.fixed_mode}{f' k={r.fixed_k}' if r.fixed_k else ''} {r.fixed:.2f}x"
        print(f"{r.name:<16} {categories.get(r.name, ''):<10} {agree:>6.0%} {r.plain_s:>8.2f} {r.auto:>5.2f}x "
              f"{fixed:>18} {r.ceiling:>7.2f}x")
    total = suite(rows)
    print(f"{'suite':<16} {'':<10} {'':>6} {sum(r.plain_s for r in rows):>8.2f} {total['auto']:>5.2f}x "
          f"{total['best_fixed']:>17.2f}x {total['ceiling']:>7.2f}x   worst auto / best fixed "
          f"{total['worst_auto_over_best_fixed']:.2f}", flush=True)
    mode, k = total["best_setting_mode"], total["best_setting_k"]
    setting = f"{mode} k={k}" if k else mode
    print(f"one setting for every reply, the best in hindsight: {setting} {total['best_setting']:.2f}x; "
          f"auto / it {total['auto'] / total['best_setting']:.3f}", flush=True)
    print(f"best fixed per reply, the luck of one k taken out (each k with its neighbours): "
          f"{total['best_fixed_steady']:.2f}x; auto / it {total['auto'] / total['best_fixed_steady']:.3f}, "
          f"worst reply {total['worst_auto_over_best_fixed_steady']:.2f}", flush=True)
    if len(runs) > 1:
        each = [suite(order) for order in runs]
        print(f"{len(runs)} orders: auto " + ", ".join(f"{s['auto']:.2f}x" for s in each)
              + f" (mean {statistics.mean(s['auto'] for s in each):.3f}x); auto / best fixed mean "
              f"{statistics.mean(s['auto'] / s['best_fixed'] for s in each):.3f}, auto / one setting mean "
              f"{statistics.mean(s['auto'] / s['best_setting'] for s in each):.3f}", flush=True)
    if first:
        alone = suite(first)
        print(f"each reply as a session's first: auto {alone['auto']:.2f}x, slowest reply {alone['slowest_auto']:.2f}x, "
              f"auto / best fixed {alone['auto'] / alone['best_fixed']:.3f}, auto / one setting "
              f"{alone['auto'] / alone['best_setting']:.3f}", flush=True)
    print(flush=True)


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""How much faster could speculation be on these prompts, on this machine?

For each prompt of the shipped suite this generates the plain greedy reply,
then records at every position of it what prompt lookup would propose and
whether the draft model's greedy guess is right (the draft reads the reply
under teacher forcing), and measures the costs: a target pass over 1..K+1
tokens and one draft-model token. With those it replays, free of machine noise:

- draft k, lookup k: the fixed modes;
- auto: edgespec's AutoPolicy, making its choices from what it has seen so far;
- ceiling: the fastest schedule any policy choosing plain, lookup (k <= K) or
  the draft model (k <= K) each cycle could reach if it knew in advance which
  guesses the target will accept (dynamic programming over the reply).

The gap between auto and the ceiling is what better guessing of acceptance
could still win; a ceiling below a speed target means no choice of drafter
and k reaches it with these two drafters on this hardware.

    .venv/bin/python scripts/speculation_ceiling.py [--max-tokens 96] [--category grounded]

Approximations: a draft cycle costs its drafted tokens times the measured
per-token cost (the draft's catch-up over accepted tokens is not modelled);
after a wrong guess the draft is assumed to go on drafting up to k.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from edgespec.bench import load_prompts  # noqa: E402
from edgespec.cli import _prompt_tokens, add_model_options, load_engine  # noqa: E402
from edgespec.engine.controller import AutoPolicy, Costs, CycleReport, FixedPolicy, measure_pass  # noqa: E402
from edgespec.engine.drafters import Draft, Drafter, PromptLookup, too_unsure  # noqa: E402
from edgespec.engine.events import GenerationParams  # noqa: E402
from edgespec.engine.runtime import ACCEPTANCE_PRIORS  # noqa: E402
from edgespec.engine.sampling import greedy, top_probability  # noqa: E402


class Recorded:
    """One prompt's plain reply and the draft model's guesses along it."""

    def __init__(self, prompt: list[int], reply: list[int], guess: list[int], confidence: list[float]):
        self.prompt, self.reply, self.guess, self.confidence = prompt, reply, guess, confidence

    def draft_run(self, i: int) -> int:
        """How many draft guesses from reply position i on are right in a row."""
        n = 0
        while i + n < len(self.reply) and self.guess[i + n] == self.reply[i + n]:
            n += 1
        return n


class ReplayedDraft(Drafter):
    """The draft model, replayed from its recorded guesses (greedy, with p_min and p_draft)."""

    name = "draft"

    def __init__(self):
        self.rec: Recorded | None = None

    def propose(self, history, k, params, rng):
        i = len(history) - len(self.rec.prompt)
        out: list[int] = []
        whole = 1.0
        for j in range(i, min(i + k, len(self.rec.reply))):
            whole *= self.rec.confidence[j]
            if too_unsure(self.rec.confidence[j], whole, params):
                break
            out.append(self.rec.guess[j])
            if self.rec.guess[j] != self.rec.reply[j]:
                out += [-1] * (k - len(out))  # what it guesses after a miss is unknown; it is rejected anyway
                break
        return Draft(out)


def record(engine, prompt: list[int], max_tokens: int) -> Recorded:
    reply: list[int] = []
    for chunk in engine.generate(prompt, GenerationParams(mode="plain", max_tokens=max_tokens)):
        reply += chunk.tokens
    seq = engine.draft_seq
    seq.sync(prompt[:-1])
    seq.extend([prompt[-1], *reply[:-1]], all_logits=True)
    rows = [seq.logits(i) for i in range(len(reply))]
    guess, confidence = [greedy(r) for r in rows], [top_probability(r) for r in rows]
    seq.truncate(len(prompt) - 1)
    return Recorded(prompt, reply, guess, confidence)


def measure_costs(engine, prompt: list[int], k_max: int) -> Costs:
    target = engine.target_seq
    target.sync(prompt[:-1])
    passes = {n: measure_pass(target, n, repeats=3) for n in range(1, k_max + 2)}
    draft = engine.draft_seq
    draft.sync(prompt[:-1])
    return Costs(passes, {"lookup": 0.0, "draft": measure_pass(draft, 1, repeats=3)})


def replay(policy, rec: Recorded, costs: Costs, params: GenerationParams, draft: ReplayedDraft) -> float:
    """Seconds the policy takes to produce rec.reply under `costs`."""
    draft.rec = rec
    history, reply, i, seconds = list(rec.prompt), rec.reply, 0, 0.0
    while i < len(reply):
        plan = policy.plan(history)
        k = min(plan.k, len(reply) - i - 1) if plan.drafter else 0
        if k <= 0:
            guesses = []
        elif plan.proposal is not None:
            guesses = plan.proposal[:k]
        else:
            guesses = plan.drafter.propose(history, k, replace(params, p_draft=plan.p_draft), None).tokens
        n = 0
        while n < len(guesses) and guesses[n] == reply[i + n]:
            n += 1
        steps = len(guesses) + (len(guesses) < k)  # a draft that stopped itself paid for the step that stopped it
        draft_s = costs.draft(plan.drafter.name, steps) if plan.drafter else 0.0
        verify_s = costs.target_pass(len(guesses) + 1)
        seconds += draft_s + verify_s
        history += reply[i : i + n + 1]
        i += n + 1
        policy.observe(CycleReport(plan, len(guesses), n, draft_s, verify_s, asked=max(k, 0)))
    return seconds


def ceiling(rec: Recorded, costs: Costs, k_max: int, lookup: PromptLookup) -> float:
    """Seconds of the fastest schedule that knows which guesses will be accepted."""
    reply, n_reply = rec.reply, len(rec.reply)
    best = [0.0] * (n_reply + 1)
    for i in range(n_reply - 1, -1, -1):
        options = [costs.target_pass(1) + best[i + 1]]
        proposal, _ = lookup.match(rec.prompt + reply[:i], k_max, skip=True)
        agreed = 0
        for k in range(1, len(proposal) + 1):
            if agreed == k - 1 and i + agreed < n_reply and proposal[k - 1] == reply[i + agreed]:
                agreed += 1
            options.append(costs.target_pass(k + 1) + best[min(i + agreed + 1, n_reply)])
        run = rec.draft_run(i)
        for k in range(1, k_max + 1):
            options.append(costs.target_pass(k + 1) + costs.draft("draft", k) + best[min(i + min(run, k) + 1, n_reply)])
        best[i] = min(options)
    return best[0]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_options(parser)
    parser.add_argument("--category", action="append", help="only these categories (repeatable)")
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--k", type=int, default=8, help="k of the fixed modes and auto (as edgespec bench)")
    args = parser.parse_args()

    with load_engine(args) as engine:
        if not engine.has_draft:
            sys.exit("this needs a draft model")
        k_max = engine.max_verify_batch() - 1
        params = GenerationParams(k=args.k)
        prompts = load_prompts(categories=args.category)
        encoded = [(p, _prompt_tokens(engine, p.prompt, raw=False, system=None)[0]) for p in prompts]
        costs = measure_costs(engine, encoded[0][1], k_max)
        print(f"costs: target pass " + ", ".join(f"{n}: {s * 1000:.0f} ms" for n, s in sorted(costs.target.items()))
              + f"; draft token {costs.per_draft_token['draft'] * 1000:.0f} ms; longest exact verify k = {k_max}")
        print(f"{'prompt':<16} {'category':<10} {'agree':>6} {'draft k' + str(args.k):>9} {'lookup k' + str(args.k):>9} "
              f"{'auto':>6} {'ceiling':>8}   (agree: the draft model's greedy guess is the target's; "
              f"then speedup over plain, replayed)")
        draft, lookup = ReplayedDraft(), PromptLookup()
        auto = AutoPolicy(Costs(costs.target, costs.per_draft_token), [lookup, draft], k_max=min(args.k, k_max),
                          lookup_k_max=k_max, priors=ACCEPTANCE_PRIORS)  # one for the suite, as in the app
        for prompt, tokens in encoded:
            rec = record(engine, tokens, args.max_tokens)
            plain = len(rec.reply) * costs.target_pass(1)
            row = [
                replay(FixedPolicy(draft, min(args.k, k_max)), rec, costs, params, draft),
                replay(FixedPolicy(lookup, min(args.k, k_max)), rec, costs, params, draft),
                replay(auto, rec, costs, params, draft),
                ceiling(rec, costs, k_max, lookup),
            ]
            agree = sum(g == r for g, r in zip(rec.guess, rec.reply)) / len(rec.reply)
            print(f"{prompt.id:<16} {prompt.category:<10} {agree:>6.0%} " + " ".join(f"{plain / s:>8.2f}x" for s in row[:2])
                  + f" {plain / row[2]:>5.2f}x {plain / row[3]:>7.2f}x", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

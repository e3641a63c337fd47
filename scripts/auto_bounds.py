#!/usr/bin/env python3
"""How far can auto's way of choosing go on the recorded suites?

Replays auto (edgespec/engine/replay.py, the tests' cost profiles) beside two
variants that know more or risk more than auto can:

- told: auto told each reply's draft-model acceptance before the reply starts
  (the rates a draft model drafting 3 tokens a cycle, while as sure as a guess
  must be to pay, has over that whole reply), instead of learning it as it goes,
  and deciding with it whether to read the prompt into the model;
- told late: the same, told once auto has decided that as it does;
- loose: auto whose ledger lends the whole reply's time instead of 2% of it,
  so that no bet is ever refused for what it could lose;
- told and loose together,

against the best fixed mode chosen per reply in hindsight (the issue "auto
takes what pays" asks for 0.97x of it over the suite and 0.9x on each reply).
What neither variant reaches is out of reach of any rule that picks each
cycle's drafter and k from a reply's acceptance and the measured costs.

    .venv/bin/python scripts/auto_bounds.py --traces tests/data/bundled_traces.json \\
        --traces tests/data/dev_traces.json [--machine "cpu 2 threads"] [--read-ahead 8] [--json]
"""

from __future__ import annotations

import argparse
import json
from typing import Sequence

from edgespec.engine.auto import Acceptance, AutoPolicy, Ledger
from edgespec.engine.costs import Costs
from edgespec.engine.policy import Bucket, CycleReport, FixedPolicy
from edgespec.engine.replay import MACHINES, ReplayedDraft, Trace, load_traces, machine_costs, replay, replay_auto, \
    replay_suite
from edgespec.limits import LIMITS

VARIANTS = ("auto", "told", "told late", "loose", "told+loose")
TOLD_K = 3
"""Draft length of the run that measures each reply's acceptance."""


def reply_acceptance(trace: Trace, costs: Costs) -> Acceptance:
    """The draft model's rates over the whole reply, as auto measures them
    (Acceptance.observe, nothing forgotten), from a run drafting TOLD_K tokens a
    cycle while as sure as a guess must be to pay on this machine."""
    rates = Acceptance(0.5, weight=1e-9, decay=1.0)

    class Measured(FixedPolicy):
        def observe(self, report: CycleReport) -> None:
            rates.observe(report.asked, report.drafted, report.accepted)

    draft = ReplayedDraft(costs)
    policy = Measured(draft, TOLD_K)
    policy._plan.p_draft = costs.break_even(draft.name)
    replay(policy, trace, costs, draft)
    return rates


def told(truth: dict[tuple[int, ...], Acceptance], *, warming: bool = True) -> type[AutoPolicy]:
    """AutoPolicy that prices the draft model at the reply's own acceptance (`truth`,
    by prompt) from its first cycle (`warming`: and when deciding to read the prompt
    into it); what it observes changes nothing."""

    class Told(AutoPolicy):
        _reply: Acceptance | None = None

        def prefill(self, prompt):
            self._reply = truth[tuple(prompt)] if warming else None
            super().prefill(prompt)
            self._reply = truth[tuple(prompt)]

        def _acceptance(self, bucket: Bucket) -> Acceptance:
            if bucket.drafter != "draft" or self._reply is None:
                return super()._acceptance(bucket)
            copy = Acceptance(0.5, decay=1.0)  # a copy: observing and fading it are lost
            copy.accepted, copy.ended = self._reply.accepted, self._reply.ended
            copy.drafted, copy.stops = self._reply.drafted, self._reply.stops
            return copy

    return Told


class LooseLedger(Ledger):
    ALLOWANCE = 1.0


def loose(policy: type[AutoPolicy]) -> type[AutoPolicy]:
    """`policy` whose ledger lends a whole reply's time: no bet refused for its risk."""

    class Loose(policy):
        def prefill(self, prompt):
            super().prefill(prompt)
            self.ledger = LooseLedger(self.ledger.expected_s, carried=self.ledger.carried)

    return Loose


def bounds(traces: Sequence[Trace], machine: str, k: int, read_ahead: int | None) -> dict:
    costs = machine_costs(machine)
    truth = {tuple(t.prompt): reply_acceptance(t, costs) for t in traces}
    rows = replay_suite(traces, costs, k, charge_warming=True, read_ahead_but=read_ahead)
    plain, fixed = sum(r.plain_s for r in rows), sum(r.fixed_s for r in rows)
    variants = {"auto": AutoPolicy, "told": told(truth), "told late": told(truth, warming=False),
                "loose": loose(AutoPolicy), "told+loose": loose(told(truth))}
    out = {"machine": machine, "best_fixed": plain / fixed}
    for name, policy in variants.items():
        seconds = replay_auto(traces, costs, k, charge_warming=True, read_ahead_but=read_ahead, policy=policy)
        worst = min(zip((r.fixed_s / s for r, s in zip(rows, seconds)), (r.name for r in rows)))
        out[name] = {"speedup": plain / sum(seconds), "of_best_fixed": fixed / sum(seconds),
                     "worst_reply_of_best_fixed": worst[0], "worst_reply": worst[1]}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--traces", action="append", required=True, help="recorded traces (speculation_ceiling.py)")
    parser.add_argument("--machine", action="append", choices=sorted(MACHINES),
                        help="cost profiles to replay on (default: all)")
    parser.add_argument("--read-ahead", type=int, default=None, metavar="N",
                        help="replay the chat's reading ahead of each prompt but its last N tokens")
    parser.add_argument("--k", type=int, default=LIMITS["k"].default)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    traces = [t for path in args.traces for t in load_traces(path)]
    results = [bounds(traces, m, min(args.k, max(machine_costs(m).target) - 1), args.read_ahead)
               for m in args.machine or MACHINES]
    if args.json:
        print(json.dumps(results, indent=1))
        return 0
    print("speedup over plain, in brackets of the best fixed mode per reply (suite; worst reply)")
    print(f"{'profile':18} {'best fixed':>10}" + "".join(f" {v:>24}" for v in VARIANTS))
    for r in results:
        cells = "".join(f" {r[v]['speedup']:6.3f}x ({r[v]['of_best_fixed']:.3f}; {r[v]['worst_reply_of_best_fixed']:.2f})"
                        for v in VARIANTS)
        print(f"{r['machine']:18} {r['best_fixed']:9.3f}x{cells}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

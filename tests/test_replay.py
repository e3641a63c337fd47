"""Auto mode replayed on recorded replies of the bundled pair (tests/data/
bundled_traces.json, written by scripts/speculation_ceiling.py --save-traces)
under the costs of several machines: on none may it be slower than plain
decoding, and where drafting pays it must pay."""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest

from edgespec.engine.auto import AutoPolicy, Ledger
from edgespec.engine.costs import Costs
from edgespec.engine.drafters import PromptLookup
from edgespec.engine.replay import ReplayedDraft, ceiling, load_traces, plain_seconds, replay
from edgespec.engine.choice import ACCEPTANCE_PRIORS

TRACES = Path(__file__).parent / "data" / "bundled_traces.json"


def linear(single: float, column: float, sizes=(1, 2, 3, 4, 5, 9, 17)) -> dict[int, float]:
    return {n: single + column * (n - 1) for n in sizes}


PROFILES = {
    # name: (target pass by size, draft token, draft catch-up per token), in seconds
    "cpu 2 threads": ({1: .035, 2: .052, 3: .062, 4: .072, 5: .085, 9: .140, 17: .250}, .010, .0035),
    "cpu 1 thread": ({1: .065, 2: .100, 3: .120, 5: .160, 9: .270, 17: .490}, .019, .0065),
    "cpu exact kernels": ({1: .045, 2: .075, 3: .090, 4: .110, 5: .125, 7: .170}, .010, .0035),
    "dear draft": ({1: .035, 2: .052, 3: .062, 4: .072, 5: .085, 9: .140, 17: .250}, .025, .008),
    "cheap draft": ({1: .035, 2: .052, 3: .062, 4: .072, 5: .085, 9: .140, 17: .250}, .004, .0012),
    "no batching gain": (linear(.035, .035), .010, .0035),
    "gpu": (linear(.010, .0002), .002, .0002),
    "slow link": (linear(.040, .0008), .010, .0035),
}


def costs(profile: str) -> Costs:
    target, draft, catch_up = PROFILES[profile]
    return Costs(target, {"draft": draft, "lookup": 0.0}, {"draft": catch_up})


def replay_suite(profile: str) -> list[tuple[str, float, float, float]]:
    """(prompt, plain s, auto s, ceiling s) for each trace, one AutoPolicy for the suite as in the app."""
    truth = costs(profile)
    draft, lookup = ReplayedDraft(truth), PromptLookup()
    k_max = min(16, max(truth.target) - 1)
    auto = AutoPolicy(costs(profile), [lookup, draft], k_max=min(8, k_max), priors=ACCEPTANCE_PRIORS)
    return [(t.name, plain_seconds(t, truth), replay(auto, t, truth, draft), ceiling(t, truth, k_max, lookup))
            for t in load_traces(TRACES)]


@pytest.mark.parametrize("profile", PROFILES)
def test_auto_is_never_slower_than_plain_decoding(profile):
    """Over the suite, auto is at least as fast as plain decoding on every machine;
    on a single reply it may lose what its ledger allows exploration (2%) and the
    overshoot of the cycles that found the budget spent (two plain passes' worth)."""
    rows = replay_suite(profile)
    report = ", ".join(f"{name} {plain / auto:.2f}x (ceiling {plain / best:.2f}x)" for name, plain, auto, best in rows)
    assert sum(auto for _, _, auto, _ in rows) <= sum(plain for _, plain, _, _ in rows) * (1 + 1e-9), report
    single = costs(profile).target_pass(1)
    for name, plain, auto, _ in rows:
        assert auto - plain <= Ledger.ALLOWANCE * plain + 2 * single, report


@pytest.mark.parametrize("profile", ["gpu", "slow link", "cpu 2 threads"])
def test_auto_wins_on_edits_wherever_verifying_is_cheaper_than_decoding(profile):
    rows = {name: plain / auto for name, plain, auto, _ in replay_suite(profile)}
    edits = [rows[name] for name in ("fix-typo", "reformat-json", "rename-variable")]
    assert statistics.geometric_mean(edits) > 1.25, rows


@pytest.mark.parametrize("profile", ["gpu", "cpu 2 threads"])
def test_no_cycle_of_auto_drafts_more_than_k(profile):
    """--k 2: no cycle drafts more than 2 tokens, whichever drafter auto takes."""
    truth = costs(profile)
    draft, lookup = ReplayedDraft(truth), PromptLookup()
    drafted = []

    class Recording(AutoPolicy):
        def observe(self, report):
            drafted.append(report.drafted)
            super().observe(report)

    auto = Recording(costs(profile), [lookup, draft], k_max=2, priors=ACCEPTANCE_PRIORS)
    for trace in load_traces(TRACES):
        replay(auto, trace, truth, draft)
    assert max(drafted) == 2

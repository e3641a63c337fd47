"""Auto mode's choices, with made-up costs and drafters (no model)."""

import json
import logging

import pytest

from edgespec.engine.auto import Acceptance, AutoPolicy, Ledger, expected_tokens, expected_verify, k_choices
from edgespec.engine.costs import (
    CATCH_UP_PROBE, Costs, calibrate, keep_healed, load_costs, pass_sizes, save_costs,
)
from edgespec.engine.policy import Bucket, CycleReport, Plan
from edgespec.engine.drafters import Draft, Drafter, Offer, PromptLookup
from tests.blocking import returns_without_blocking


class FakeDraftModel(Drafter):
    name = "draft"
    missed = 2  # tokens it has not read: a steady cycle's catch-up

    def __init__(self):
        self.prefilled: list[int] = []

    def prefill(self, prompt):
        self.prefilled.append(len(prompt))

    def propose(self, history, k, params, rng):
        return Draft([0] * k)

    def behind(self, history):
        return self.missed


# A GPU-like machine: checking 5 tokens costs about as much as 1.
GPU = {1: 0.020, 2: 0.021, 5: 0.024}
# This CPU: a pass over 5 tokens costs 2.7x a single one.
CPU = {1: 0.028, 2: 0.040, 5: 0.076}


def run(p, history, n, *, accepted=0):
    """n cycles of auto, each observed as it was planned: a plain pass, or a
    draft with `accepted` tokens right (at most all it drafted)."""
    plans = []
    for _ in range(n):
        plan = p.plan(history)
        k = plan.k if plan.drafter else 0
        draft_s = p.costs.draft(plan.drafter.name, k) if plan.drafter else 0.0
        p.observe(CycleReport(plan, drafted=k, accepted=min(accepted, k), draft_s=draft_s,
                              verify_s=p.costs.target_pass(k + 1)))
        plans.append(plan)
    return plans


def policy(target_costs, draft_token_s, *, prior, k_max=4):
    costs = Costs(target_costs, {"draft": draft_token_s, "lookup": 0.0})
    return AutoPolicy(costs, [PromptLookup(), FakeDraftModel()], k_max=k_max, priors={"draft": prior, "lookup": prior})


def test_expected_tokens_formula():
    assert expected_tokens(0.0, 4) == 1.0
    assert expected_tokens(1.0, 4) == 5.0
    assert expected_tokens(0.5, 2) == pytest.approx(1.75)


def test_a_draft_that_stops_itself_is_priced_at_the_mean_of_the_passes_it_leads_to():
    """A draft model that goes on at each step with probability 0.5 drafts 0, 1, 2 or 3
    tokens (1/2, 1/4, 1/8, 1/8 of the time at k = 3): the target checks 1 to 4
    tokens. A pass costs less a token the longer it is, so the pass over the mean
    length (1.875 tokens) costs more than the mean of those passes."""
    costs = Costs({1: 0.030, 2: 0.050, 4: 0.070}, {"draft": 0.0})
    mean_of_passes = 0.5 * 0.030 + 0.25 * 0.050 + 0.125 * 0.060 + 0.125 * 0.070
    one, two, three = expected_verify(costs, 0.5, [1, 2, 3])
    assert three == pytest.approx(mean_of_passes) and three < costs.target_pass(1.875)
    assert (one, two) == pytest.approx((0.5 * 0.030 + 0.5 * 0.050, 0.5 * 0.030 + 0.25 * 0.050 + 0.25 * 0.060))
    assert expected_verify(costs, 0.5, [3]) == [three]  # the lengths between are averaged over all the same
    assert expected_verify(costs, 1.0, [1, 3]) == [costs.target_pass(2), costs.target_pass(4)]  # proposals in full
    p = AutoPolicy(costs, [FakeDraftModel()], k_max=3)
    a = Acceptance(0.6)
    a.drafted, a.stops = 1.0, 1.0  # continuation 0.5
    assert p._rates(p.drafters[0], a, [3]) == pytest.approx([expected_tokens(0.6, 3) / mean_of_passes])


def test_an_idle_draft_model_is_rated_again_at_its_long_run_rate():
    """A draft model is measured only while auto uses it, and auto stops using it
    after a bad stretch: its rate would stay frozen at that stretch's low, which is
    low partly by chance (auto stopped because it was low). Idle, its recent rate
    fades back to its long-run one, as fast as new cycles would have faded it, and
    it is chosen again."""
    costs = Costs(CPU, {"draft": 0.004, "lookup": 0.0})
    p = AutoPolicy(costs, [FakeDraftModel()], k_max=4, priors={"draft": 0.8})
    history = [1, 2, 3, 4, 5, 6]
    for _ in range(40):  # right 3 cycles in 4, over many cycles
        run(p, history, 3, accepted=4)
        run(p, history, 1, accepted=0)
    long_run = p.acceptance[Bucket("draft")].rate
    plans = run(p, history, 6, accepted=0)  # a bad stretch: every guess rejected
    low = p.acceptance[Bucket("draft")].rate
    assert low < long_run - 0.2 and plans[-1].kind == "plain"
    plans = run(p, history, 20, accepted=4)  # right again, if asked
    assert plans[0].kind == "plain" and "chosen" in [plan.kind for plan in plans]  # before a probe falls due
    assert p.acceptance[Bucket("draft")].rate > (low + long_run) / 2


def test_cost_interpolation_and_extrapolation():
    costs = Costs({1: 1.0, 5: 3.0}, {})
    assert costs.target_pass(3) == pytest.approx(2.0)
    assert costs.target_pass(9) == pytest.approx(5.0)  # the last slope, extended
    assert Costs({1: 2.0}, {}).target_pass(3) == pytest.approx(6.0)


def test_the_calibration_measures_passes_at_powers_of_two_and_just_past_them():
    """Where a CPU's kernels multiply columns in blocks (4 at a time for llama.cpp's
    repacked weights), a pass costs a step more just past a multiple of the block:
    the sizes at and after each power of two show those steps, whatever the block."""
    assert pass_sizes(64) == [1, 2, 3, 4, 5, 8, 9, 16, 17, 32, 33, 64, 65]
    assert pass_sizes(10) == [1, 2, 3, 4, 5, 8, 9, 11]
    assert pass_sizes(4) == [1, 2, 3, 4, 5] and pass_sizes(0) == [1]


def test_auto_verifies_in_the_pass_the_machine_does_cheapest():
    """Measured on an AMD EPYC Zen 5 (2 threads, repacked Q4_K weights): a pass over
    16 tokens costs 149 ms, over 17 182 ms. On a long copy auto drafts 15 tokens,
    not 16 (K_GRID's): the 16th would cost more than a pass of its own (24 ms)."""
    zen5 = {1: .024, 2: .045, 3: .062, 4: .066, 5: .082, 8: .120, 9: .131, 16: .149, 17: .182}
    p = AutoPolicy(Costs(zen5, {"lookup": 0.0}), [PromptLookup()], k_max=16, priors={"lookup": 0.5})
    p.acceptance[Bucket("lookup", "8-gram")] = Acceptance(0.995, weight=100.0)
    p.ledger.saved = 10.0
    history = list(range(200)) + list(range(100))  # 100 tokens of a 200-token copy so far
    assert p.plan(history).k == 15
    p.acceptance[Bucket("lookup", "8-gram")] = Acceptance(0.85, weight=100.0)
    assert p.plan(history).k == 3  # unsure: 4 tokens for the price of 3 (66 ms against 62)


def test_cost_interpolation_follows_sizes_measured_later_and_a_restart():
    costs = Costs({1: 1.0, 9: 5.0}, {})
    assert costs.target_pass(5) == pytest.approx(3.0)
    costs.observe(CycleReport(Plan(None, 0), drafted=4, accepted=0, draft_s=0.0, verify_s=2.0))  # a 5-token pass
    assert costs.target_pass(5) == pytest.approx(2.0)
    drift = 1.0 + 0.2 * (2.0 / 3.0 - 1.0)  # the pass ran at 2/3 of the calibration's line: so may the others
    assert costs.target_pass(1) == pytest.approx(drift)
    assert costs.target_pass(3) == pytest.approx((drift + 2.0) / 2)  # between 1 and the newly measured 5
    assert costs.target_pass(7) == pytest.approx((2.0 + 5.0 * drift) / 2)
    costs.restart()
    assert costs.target_pass(3) == pytest.approx(2.0)  # the calibration's line again


def test_sizes_not_measured_since_the_calibration_move_with_those_that_were():
    """A machine slower (or faster) than at its calibration is so at every size: a
    context grown long, a noisy neighbour. Moving only the sizes in use (the single
    pass, in plain decoding) would make the others look cheap beside them."""
    costs = Costs({1: 0.032, 2: 0.064, 5: 0.130}, {})
    for _ in range(30):  # plain cycles, each 12.5% dearer than calibrated
        costs.observe(CycleReport(Plan(None, 0), drafted=0, accepted=0, draft_s=0.0, verify_s=0.036))
    assert costs.target_pass(1) == pytest.approx(0.036, rel=0.01)
    assert costs.target_pass(2) == pytest.approx(0.072, rel=0.01)
    assert costs.target_pass(5) == pytest.approx(0.14625, rel=0.01)
    costs.observe(CycleReport(Plan(None, 0), drafted=1, accepted=0, draft_s=0.0, verify_s=0.060))
    assert costs.target_pass(2) == pytest.approx(0.072 + 0.2 * (0.060 - 0.072), rel=0.01)  # measured: its own


def test_a_short_draft_that_does_not_pay_is_not_chosen_when_the_machine_slows():
    """Where a 2-token pass costs two single ones (AMD EPYC Zen 4, 2 threads), a
    1-token draft cannot pay: single passes measured slower than calibrated must
    not make it look as if it did (it did so at 1.03-1.10x, and lost)."""
    zen4 = {1: .032, 2: .064, 3: .091, 4: .103, 5: .130}
    p = AutoPolicy(Costs(zen4, {"lookup": 0.0}), [PromptLookup()], k_max=1, priors={"lookup": 0.5})
    p.acceptance[Bucket("lookup", "8-gram")] = Acceptance(0.95, weight=100.0)
    p.ledger.saved = 10.0
    history = list(range(200)) + list(range(100))  # 100 tokens of a 200-token copy so far
    for _ in range(30):
        p.costs.observe(CycleReport(Plan(None, 0), drafted=0, accepted=0, draft_s=0.0, verify_s=0.036))
    assert p.plan(history).drafter is None


def test_plain_when_drafting_cannot_pay():
    """A 0.5B draft on this CPU: a draft token costs a third of a target token and
    batches are expensive; at 60% acceptance nothing beats plain decoding."""
    p = policy(CPU, 0.010, prior=0.6)
    plan = p.plan([1, 2, 3, 4, 5, 6])  # no repeated n-gram: lookup has nothing
    assert plan.drafter is None and plan.k == 0
    assert plan.declined.speedup < 1 + AutoPolicy.MARGIN  # the best draft would not pay


def test_long_drafts_when_acceptance_is_high_and_passes_are_cheap():
    p = policy(GPU, 0.002, prior=0.9)
    plan = p.plan([1, 2, 3, 4, 5, 6])
    assert plan.drafter.name == "draft" and plan.k == 4
    assert plan.speedup > 1 + AutoPolicy.MARGIN and plan.acceptance == pytest.approx(0.9)


def test_lookup_with_a_long_match_can_pay_even_on_this_cpu():
    """On a fresh reply with one token at stake; longer once a cycle has saved something."""
    p = policy(CPU, 0.010, prior=0.9)
    history = [9, 8, 7, 6, 5, 4, 3, 2, 1, 9, 8, 7]
    assert p.plan(history).name == "lookup"
    p.ledger.saved = CPU[1]
    plan = p.plan(history)
    assert plan.drafter.name == "lookup" and plan.k >= 2


def test_adapts_when_acceptance_falls():
    p = policy(GPU, 0.002, prior=0.9)
    draft = p.drafters[1]
    assert p.plan([1, 2, 3]).drafter is draft
    for _ in range(30):  # every cycle: the first draft token rejected
        p.observe(CycleReport(Plan(draft, 4), drafted=4, accepted=0, draft_s=0.008, verify_s=0.024))
    plan = p.plan([1, 2, 3])
    assert plan.drafter is None


def test_probes_a_drafter_it_stopped_using_when_the_ledger_can_pay_for_it():
    p = policy(CPU, 0.010, prior=0.6)
    plans = run(p, [1, 2, 3, 4, 5, 6], 400)
    probes = [i for i, plan in enumerate(plans) if plan.kind == "probe"]
    assert probes and probes[0] >= AutoPolicy.PROBE_EVERY - 1
    assert all(plan.kind == "plain" for plan in plans[:probes[0]])
    assert plans[probes[0]].drafter.name == "draft" and plans[probes[0]].bucket == Bucket("draft")


def test_exploration_never_costs_more_than_the_ledger_allows():
    """On a machine where drafting never pays and every guess is wrong, what auto
    loses to probes stays within Ledger.ALLOWANCE of the plain decode time."""
    p = policy(CPU, 0.010, prior=0.6)
    run(p, [1, 2, 3, 4, 5, 6], 2000)
    assert p.ledger.saved < 0  # it did probe, and the probes lost
    assert -p.ledger.saved <= Ledger.ALLOWANCE * p.ledger.plain_s


def test_once_the_ledger_is_spent_nothing_is_drafted():
    p = policy(GPU, 0.010, prior=0.7)
    history = [1, 2, 3, 4, 5, 6]
    assert p.plan(history).kind == "chosen"  # the prior says it pays, by ~10%
    p.ledger.saved = -1.0  # far behind
    plan = p.plan(history)
    assert plan.kind == "plain" and plan.declined.speedup > 1 + AutoPolicy.MARGIN  # it would pay, but risks too much


def test_costs_follow_measured_cycles():
    costs = Costs({1: 0.03, 5: 0.08}, {"draft": 0.01})
    d = FakeDraftModel()
    for _ in range(50):
        costs.observe(CycleReport(Plan(d, 4), drafted=4, accepted=2, draft_s=0.004, verify_s=0.05))
    assert costs.target_pass(5) == pytest.approx(0.05, rel=1e-3)
    assert costs.draft("draft", 1) == pytest.approx(0.001, rel=1e-3)


def test_a_new_reply_prices_passes_from_the_calibration_again():
    """Pass costs are kept by size, but grow with the context: after long passes
    measured deep in a long conversation, a short new one must not read them as
    they were (auto would stay plain, and plain cycles never re-measure them)."""
    p = policy(CPU, 0.010, prior=0.9)
    history = [9, 8, 7, 6, 5, 4, 3, 2, 1, 9, 8, 7]
    for _ in range(30):  # a long context: passes over 2 and 5 tokens cost 3.5x and 10x a single one
        p.observe(CycleReport(Plan(PromptLookup(), 4), drafted=4, accepted=4, draft_s=0.0, verify_s=0.35))
        p.observe(CycleReport(Plan(PromptLookup(), 1), drafted=1, accepted=1, draft_s=0.0, verify_s=0.12))
        p.observe(CycleReport(Plan(None, 0), drafted=0, accepted=0, draft_s=0.0, verify_s=0.035))
    assert p.plan(history).drafter is None  # as measured there, drafting would not pay
    p.prefill(history)
    assert p.costs.target == CPU
    plan = p.plan(history)
    assert plan.drafter.name == "lookup" and plan.k >= 2


def plain_pass(seconds, *, size=1):
    """A cycle's report: a pass over `size` tokens (a draft of size - 1) that took `seconds`."""
    return CycleReport(Plan(None, 0), drafted=size - 1, accepted=0, draft_s=0.0, verify_s=seconds)


def test_a_calibration_taken_at_a_busy_moment_heals_to_the_typical_pass_seen_at_the_next_reply():
    """Seen: a single pass calibrated at 125 ms on a machine where it runs in 106 when
    quiet. A busy machine only makes passes slower: the next reply starts from what the
    size took in this one's cycles (their median, of HEAL_PASSES at least)."""
    costs = Costs({1: 0.125, 5: 0.300}, {"draft": 0.010}, {"draft": 0.002})
    for seconds in (0.110, 0.106, 0.130):
        costs.observe(plain_pass(seconds))
    for seconds in (0.250, 0.260):  # too few to tell what size 5 costs
        costs.observe(plain_pass(seconds, size=5))
    costs.observe(plain_pass(0.050, size=3))  # not a calibrated size: nothing to heal
    costs.restart()
    assert costs.calibrated == costs.target == {1: 0.110, 5: 0.300}
    assert (costs.per_draft_token, costs.per_catch_up_token) == ({"draft": 0.010}, {"draft": 0.002})
    assert costs.fresh().target == {1: 0.110, 5: 0.300}


def test_healing_takes_no_size_to_its_luckiest_pass():
    """A size that runs hundreds of times (a single pass) shows a far luckier fastest pass
    than one that runs a few times, and the first ones run at the shortest context (seen on
    a 2-core Xeon: single passes' fastest 65 ms, median 78; 4-token passes' fastest 107,
    median 124). Healed to the fastest, a 4-token pass was priced at 1.65 single ones where
    it runs at 1.58: the prices of drafts against plain decoding follow the sizes' typical
    passes, whichever ran more often."""
    costs = Costs({1: 0.090, 4: 0.140}, {})
    costs.observe(plain_pass(0.065))
    for _ in range(400):
        costs.observe(plain_pass(0.078))
    for seconds in (0.107, 0.124, 0.125, 0.130):
        costs.observe(plain_pass(seconds, size=4))
    costs.restart()
    assert costs.calibrated == pytest.approx({1: 0.078, 4: 0.1245})


def test_slower_passes_never_raise_a_calibrated_size():
    """The calibration runs at an empty context, the cheapest a pass gets: a pass
    measured slower since ran at a longer context or beside a busy neighbour."""
    costs = Costs({1: 0.106, 5: 0.300}, {})
    for _ in range(20):
        costs.observe(plain_pass(0.140))
        costs.observe(plain_pass(0.420, size=5))
    costs.restart()
    assert costs.calibrated == costs.target == {1: 0.106, 5: 0.300}


def test_a_kept_calibration_is_lowered_to_a_healed_one_and_its_draft_prices_kept(tmp_path):
    """What a process healed is kept for the next, size by size and only lower (another
    process may have kept a lower one meanwhile); the draft prices stay as measured at
    load, not as the last reply's cycles moved them."""
    kept = tmp_path / "costs.json"
    draft, catch_up = {"draft": 0.010, "lookup": 0.0}, {"draft": 0.002}
    save_costs(Costs({1: 0.125, 2: 0.150, 5: 0.300}, draft, catch_up), kept)
    costs = load_costs(kept)
    for _ in range(3):
        costs.observe(plain_pass(0.106))
        costs.observe(plain_pass(0.420, size=5))
    costs.observe(CycleReport(Plan(FakeDraftModel(), 1), drafted=1, accepted=1, draft_s=0.030, verify_s=0.160))
    costs.restart()
    save_costs(Costs({1: 0.125, 2: 0.140, 5: 0.300}, draft, catch_up), kept)  # another process healed size 2
    keep_healed(costs, kept)
    again = load_costs(kept)
    assert again.calibrated == {1: 0.106, 2: 0.140, 5: 0.300}
    assert (again.per_draft_token, again.per_catch_up_token) == (draft, catch_up)
    written = kept.stat().st_ino  # (each write replaces the file)
    keep_healed(costs, kept)  # nothing lower: not written again
    assert kept.stat().st_ino == written
    keep_healed(costs, tmp_path / "gone.json")  # none kept (cleared meanwhile): none made
    assert not (tmp_path / "gone.json").exists()


def test_a_catch_up_after_idle_cycles_is_measured_apart_from_drafting():
    costs = Costs({1: 0.03, 5: 0.08}, {"draft": 0.01}, {"draft": 0.001})
    d = FakeDraftModel()
    # After 80 idle cycles the draft model first reads 80 tokens (0.4 s), then drafts 2.
    costs.observe(CycleReport(Plan(d, 2), drafted=2, accepted=2, draft_s=0.42, verify_s=0.05,
                              caught_up=80, catch_up_s=0.4))
    assert costs.draft("draft", 1) == pytest.approx(0.01)
    assert costs.catch_up("draft", 102) == pytest.approx(100 * (0.001 + 0.2 * (0.4 / 78 - 0.001)))
    assert costs.catch_up("draft", 2) == 0.0  # a steady cycle's catch-up is part of drafting
    # In steady use it reads the last draft token and the target's token each cycle.
    costs.observe(CycleReport(Plan(d, 4), drafted=4, accepted=4, draft_s=0.048, verify_s=0.08, caught_up=2))
    assert costs.draft("draft", 1) == pytest.approx(0.01 + 0.2 * (0.012 - 0.01))


def test_a_short_catch_up_does_not_price_a_long_one():
    """Reading 3 missed tokens is mostly one pass's fixed cost: priced a token, it made
    a 176-token catch-up look 40% cheaper than it was, and auto risked more than its
    ledger held. Only catch-ups as long as the calibration's are learnt from."""
    costs = Costs({1: 0.04, 5: 0.05}, {"draft": 0.01}, {"draft": 0.0035})
    d = FakeDraftModel()
    for _ in range(20):
        costs.observe(CycleReport(Plan(d, 2), drafted=2, accepted=2, draft_s=0.0235, verify_s=0.05,
                                  caught_up=3, catch_up_s=0.0035))
    assert costs.catch_up("draft", 176) == pytest.approx(174 * 0.0035)
    costs.observe(CycleReport(Plan(d, 2), drafted=2, accepted=2, draft_s=0.083, verify_s=0.05,
                              caught_up=20, catch_up_s=0.063))
    assert costs.catch_up("draft", 176) == pytest.approx(174 * 0.0035)


class RecordingSeq:
    """A KV sequence that computes nothing and records each pass: its tokens, and
    whether it asked for every token's logits."""

    def __init__(self):
        self.tokens, self.room, self.passes = [1, 2, 3], 100, []

    def extend(self, tokens, *, all_logits=False):
        self.passes.append((len(tokens), all_logits))
        self.tokens += list(tokens)

    def truncate(self, n):
        del self.tokens[n:]


def test_the_calibration_prices_a_draft_models_reading_as_readings_run():
    """A reading (a new prompt, or history the draft model missed) needs its last
    token's logits only; a verify pass needs every token's. Measured with every token's
    logits (a 151,936-word output layer for each), reading was priced dearer than it
    runs (the bundled 0.5B Q4_0 draft, 2-core Xeon: 16 tokens in 92 ms against 72 as
    read), and warming the draft model for a prompt looked dearer than it is."""
    target, draft = RecordingSeq(), RecordingSeq()
    calibrate(target, draft, 4)
    assert target.passes and all(all_logits for _, all_logits in target.passes)
    assert (CATCH_UP_PROBE, False) in draft.passes and (CATCH_UP_PROBE, True) not in draft.passes
    assert (target.tokens, draft.tokens) == ([1, 2, 3], [1, 2, 3])


def test_a_kept_calibration_prices_reading_as_it_was_measured(tmp_path):
    """Kept, the price of reading a missed token comes back as measured. One kept by an
    earlier version (measured with every token's logits, or divided by all of the
    batch's tokens) has none: the draft model's prices are measured again, its target
    passes kept (Policies._make_auto)."""
    costs = Costs({1: 0.04, 2: 0.05}, {"draft": 0.01, "lookup": 0.0}, {"draft": 0.0035})
    kept = tmp_path / "costs.json"
    save_costs(costs, kept)
    again = load_costs(kept)
    assert (again.target, again.per_draft_token, again.per_catch_up_token) == (
        costs.target, costs.per_draft_token, costs.per_catch_up_token)
    for version in ({}, {"catch_up_past": 2}):
        old = {"target": {"1": 0.04, "2": 0.05}, "per_draft_token": {"draft": 0.01, "lookup": 0.0},
               "per_catch_up_token": {"draft": 0.0035}, **version}
        kept.write_text(json.dumps(old))
        assert load_costs(kept).per_catch_up_token == {} and load_costs(kept).target == costs.target


@pytest.mark.parametrize("damage", [
    "", "[]", '{"target": []}', "[" * 100_000,
    '{"target": {"1": ' + "9" * 400 + '}, "per_draft_token": {}, "per_catch_up_token": {}}',
], ids=["empty", "a list", "another shape", "deeply nested", "a number past a float"])
def test_a_damaged_kept_calibration_is_measured_again(tmp_path, damage):
    """The kept calibration is a cache: one that is not a calibration is not used (None: measured again)."""
    kept = tmp_path / "costs.json"
    kept.write_text(damage)
    assert load_costs(kept) is None


@pytest.mark.parametrize("what", ["a FIFO", "a folder"])
def test_a_kept_calibration_that_is_not_a_file_is_measured_again_without_waiting(tmp_path, what):
    """Only a regular file is read: a FIFO in its place blocked the first auto reply until a writer came."""
    import os

    kept = tmp_path / "costs.json"
    os.mkfifo(kept) if what == "a FIFO" else kept.mkdir()
    assert returns_without_blocking(kept, lambda: load_costs(kept)) is None


def test_a_file_where_the_calibration_s_folder_belongs_only_means_measuring_again(tmp_path, caplog):
    """save_costs is best effort: a folder it cannot make is a log line (its clean-up raised NotADirectoryError)."""
    (tmp_path / "measured").write_text("not a folder")
    with caplog.at_level(logging.WARNING, logger="edgespec.cache"):
        save_costs(Costs({1: 0.04}, {"lookup": 0.0}), tmp_path / "measured" / "costs.json")
    assert "could not keep the calibration" in caplog.text


def test_acceptance_estimate():
    a = Acceptance(0.5, weight=0.0001)
    for _ in range(100):
        a.observe(4, 4, 3)  # three accepted, then a rejection: a = 3 / 4
    assert a.rate == pytest.approx(0.75, abs=0.01)
    assert a.continuation == pytest.approx(1.0)


def test_a_drafter_that_stops_itself_ends_the_run_but_is_not_rejected():
    a = Acceptance(0.5, weight=0.0001)
    for _ in range(100):
        a.observe(4, 2, 2)  # asked for 4, drafted 2 (then unsure), both accepted
    assert a.rate == pytest.approx(2 / 3, abs=0.01)  # the cycle's run ended after 2 all the same
    assert a.continuation == pytest.approx(2 / 3, abs=0.01)


# This CPU, as measured: a verify column costs a third of a target pass, a draft step a quarter.
THIS_CPU = {1: 0.090, 2: 0.124, 4: 0.179, 7: 0.257}


def test_a_draft_model_that_stops_when_unsure_is_priced_by_what_it_drafts():
    """Right on everything it drafts but unsure 40% of the time, a draft model that
    stops when unsure pays: a stop costs one draft step, not a target column. One
    that drafted blindly with the same 60% acceptance would not pay."""
    def choice(continuation):
        p = AutoPolicy(Costs(THIS_CPU, {"draft": 0.024, "lookup": 0.0}), [PromptLookup(), FakeDraftModel()],
                       k_max=6, priors={"lookup": 0.0})
        a = p.acceptance[Bucket("draft")] = Acceptance(0.6, weight=100.0)
        a.drafted, a.stops = continuation * 100.0, (1.0 - continuation) * 100.0
        p.ledger.saved = 10.0  # a reply that has saved plenty: pricing alone decides
        return p.plan([1, 2, 3, 4, 5, 6])

    careful = choice(0.6)
    assert careful.drafter is not None and careful.drafter.name == "draft" and careful.k >= 4
    assert choice(1.0).drafter is None


def test_a_new_reply_forgets_most_of_what_the_last_one_taught():
    """A draft model rated low on a chat reply wins back its place on a code
    reply after one good probe, instead of sitting out the reply."""
    p = AutoPolicy(Costs(THIS_CPU, {"draft": 0.024, "lookup": 0.0}), [PromptLookup(), FakeDraftModel()],
                   k_max=6, priors={"draft": 0.7, "lookup": 0.0})
    draft = p.drafters[1]
    for _ in range(40):  # a chat reply: the draft model's second guess is wrong
        p.observe(CycleReport(Plan(draft, 2), drafted=2, accepted=1, draft_s=0.048, verify_s=0.151))
    history = [1, 2, 3, 4, 5, 6]
    assert p.plan(history).drafter is None
    run(p, history, 1000)  # plain cycles: the ledger has made up for those losses
    p.prefill(history)  # the next reply
    plans = [p.plan(history) for _ in range(AutoPolicy.PROBE_FIRST)]
    [probe] = [plan for plan in plans if plan.kind == "probe"]  # early in the reply
    assert probe.drafter is draft
    p.observe(CycleReport(probe, drafted=2, accepted=2, draft_s=0.048, verify_s=0.151))
    assert p.plan(history).drafter is draft


def test_probes_back_off_while_they_do_not_pay():
    p = policy(GPU, 0.001, prior=0.05)  # a GPU and a draft model that is always wrong: probes are cheap
    probes = [i for i, plan in enumerate(run(p, [1, 2, 3, 4, 5, 6], 400)) if plan.kind == "probe"]
    gaps = [b - a for a, b in zip(probes, probes[1:])]
    assert len(gaps) >= 3 and gaps == sorted(gaps) and gaps[-1] >= 2 * gaps[0]


def test_unused_lookup_proposals_are_scored_against_what_was_generated():
    """Plain cycles still tell how lookup would have done: when the reply starts
    copying, auto switches to lookup without paying for a probe."""
    p = policy(CPU, 0.010, prior=0.3)
    history = [9, 8, 7, 6, 5, 4, 3, 2, 1, 9, 8, 7]  # lookup proposes 6, 5, 4, ...
    plans = []
    for _ in range(12):
        plans.append(p.plan(history))
        history.append(history[len(history) - 9])  # the model does copy
    assert plans[0].drafter is None  # at 30% assumed acceptance lookup does not pay
    assert plans[-1].drafter is not None and plans[-1].drafter.name == "lookup"


def test_lookup_is_not_probed_but_a_draft_model_is():
    p = policy(GPU, 0.001, prior=0.05)
    history = [9, 8, 7, 6, 5, 4, 3, 2, 1, 9, 8, 7]
    probed = set()
    for i in range(3 * AutoPolicy.PROBE_EVERY):
        [plan] = run(p, history, 1)
        if plan.kind == "probe":
            probed.add(plan.drafter.name)
        history.append(100 + i)  # never what lookup proposes
    assert probed == {"draft"}


def test_a_draft_model_far_behind_must_pay_for_reading_what_it_missed():
    # A GPU-like machine where drafting pays, but the draft model has not read
    # the last 300 tokens (auto used prompt lookup meanwhile): even spread over
    # the cycles it would serve, reading them costs more than drafting wins, so
    # auto stays off it until a probe.
    costs = Costs(GPU, {"draft": 0.002, "lookup": 0.0}, {"draft": 0.0015})
    draft = FakeDraftModel()
    p = AutoPolicy(costs, [PromptLookup(), draft], k_max=4, priors={"draft": 0.9, "lookup": 0.5})
    assert p.plan([1, 2, 3, 4, 5, 6]).drafter is draft
    draft.missed = 300
    assert p.plan([1, 2, 3, 4, 5, 6]).drafter is None


def test_switching_back_to_a_draft_model_spreads_its_catch_up_over_the_cycles_it_serves():
    # This CPU, a draft model right 99% of the time that sat out a 20-token
    # lookup run: reading those 20 tokens (0.18 s) charged to one cycle would
    # keep it idle for good (it only falls further behind); spread over the
    # cycles it is expected to serve, switching back pays.
    costs = Costs({1: 0.10, 5: 0.23}, {"draft": 0.03, "lookup": 0.0}, {"draft": 0.01})
    draft = FakeDraftModel()
    p = AutoPolicy(costs, [PromptLookup(), draft], k_max=4, priors={"draft": 0.99, "lookup": 0.5})
    p.ledger.saved = 10.0  # the lookup run saved plenty: pricing alone decides
    draft.missed = 20
    assert p.plan([1, 2, 3, 4, 5, 6]).drafter is draft
    one_cycle = expected_tokens(0.99, 4) / (0.23 + 4 * 0.03 + costs.catch_up("draft", 20))
    assert one_cycle < 1 / 0.10  # what the old rule compared: plain would have won


def test_a_draft_model_is_not_switched_back_to_where_the_other_drafters_leave_it_nothing():
    """The rule a probe follows holds for a switch: a draft model that sat out while
    prompt lookup copied nearly all of the reply is not read up to date, however
    right it is rated, when the reading costs more than it can win where lookup
    leaves room. Spread over the cycles it would serve, the reading looked cheap; but
    in a reply that copies, those cycles are lookup's (an edit replayed on a 2-core
    Xeon lost 25% to such a switch, 13 tokens before its end)."""
    costs = Costs({1: 0.10, 5: 0.23}, {"draft": 0.03, "lookup": 0.0}, {"draft": 0.01})
    draft = FakeDraftModel()
    p = AutoPolicy(costs, [PromptLookup(), draft], k_max=4, priors={"draft": 0.99, "lookup": 0.5})
    p.ledger.saved = 10.0  # the lookup run saved plenty: the ledger does not decide
    draft.missed = 30  # reading 0.3 s: spread over SWITCH_CYCLES, switching would pay
    assert p.plan([1, 2, 3, 4, 5, 6]).drafter is draft
    p.ledger.plain_s, p.ledger.plain_by = 10.0, {"lookup": 9.8}  # but lookup served 98% of this reply
    assert p._expected_saving(draft, p.ledger) < costs.catch_up("draft", 30)
    assert p.plan([1, 2, 3, 4, 5, 6]).drafter is None


def test_a_new_reply_warms_a_draft_model_that_can_pay_and_probes_it_early():
    p = policy(CPU, 0.010, prior=0.3)  # at 30% the draft model is never chosen outright
    history = [1, 2, 3, 4, 5, 6]
    run(p, history, 400)  # a long reply: the wait between probes has grown
    draft = p.drafters[1]
    p.prefill(history)  # the next reply's prompt
    assert draft.prefilled == [len(history)]
    plans = [p.plan(history) for _ in range(AutoPolicy.PROBE_FIRST)]
    assert plans[-1].drafter is draft and plans[-1].kind == "probe"


def test_reading_ahead_warms_a_draft_model_that_can_pay_whatever_its_reading_would_cost_a_reply():
    """The chat reads a message into the models while it is written (Engine.read):
    no reply waits for that reading, so a draft model that can pay here reads it
    however dear (2,000 tokens, 8 s), and the reply then finds it warm. One that
    cannot pay on this machine (as slow as the target) reads nothing. Not a reply:
    nothing learnt, the ledger untouched."""
    costs = Costs(GPU, {"draft": 0.002, "lookup": 0.0}, {"draft": 0.004})
    draft = FakeDraftModel()
    p = AutoPolicy(costs, [PromptLookup(), draft], k_max=4, priors={"draft": 0.9, "lookup": 0.5})
    draft.missed = 2000
    ledger = p.ledger
    p.read_ahead(list(range(1, 2001)))
    assert draft.prefilled == [2000] and p.ledger is ledger and p.ledger.plain_s == 0
    p.prefill(list(range(1, 2001)))  # the reply: its prompt, read ahead, costs what it is behind
    assert draft.prefilled == [2000]  # 8 s behind, as FakeDraftModel tells: not warmed at the reply
    draft.missed = 3
    p.prefill(list(range(1, 2004)))
    assert draft.prefilled == [2000, 2003]  # three tokens behind: warmed
    slow = FakeDraftModel()
    p = AutoPolicy(Costs(GPU, {"draft": 0.020, "lookup": 0.0}, {"draft": 0.004}), [PromptLookup(), slow], k_max=4,
                   priors={"draft": 0.9, "lookup": 0.5})
    p.read_ahead(list(range(1, 2001)))
    assert slow.prefilled == []


def test_a_draft_model_the_last_reply_gained_nothing_from_is_not_warmed_at_a_dear_price():
    """A session of edits served by prompt lookup: reading each new prompt (the
    last reply and the new message) into an idle draft model would delay every
    first token for nothing. It is warmed when the last reply's savings from it
    would have paid for that, or when warming costs no more than the ledger lends
    or than a third of what the draft model is expected to save in a reply of the
    usual length (AutoPolicy.WARM_MARGIN: a reply may be far shorter)."""
    costs = Costs(GPU, {"draft": 0.002, "lookup": 0.0}, {"draft": 0.004})
    draft = FakeDraftModel()
    p = AutoPolicy(costs, [PromptLookup(), draft], k_max=4, priors={"draft": 0.9, "lookup": 0.5})
    prompt = list(range(1, 3001))
    draft.missed = 2000  # 8 s to read: more than a reply of the usual length could save
    p.prefill(prompt)
    assert draft.prefilled == []
    draft.missed = 200  # 0.8 s: over a third of what a warm draft model right 90% of the time saves here
    assert costs.catch_up("draft", 200) < p._expected_saving(draft) < 3 * costs.catch_up("draft", 200)
    p.prefill(prompt)
    assert draft.prefilled == []
    draft.missed = 100  # 0.4 s: under a third of it
    assert p._expected_saving(draft) > AutoPolicy.WARM_MARGIN * costs.catch_up("draft", 100)
    p.prefill(prompt)
    assert draft.prefilled == [len(prompt)]  # the first reply: warmed on what it is expected to save
    draft.missed = 2000
    lookup = p.drafters[0]
    for _ in range(100):  # a reply served by lookup alone
        p.observe(CycleReport(Plan(lookup, 8), drafted=8, accepted=8, draft_s=0.0, verify_s=0.026))
    p.prefill(prompt)
    assert draft.prefilled == [len(prompt)]  # not again: it gained nothing
    draft.missed = 2  # a steady chat: little to read
    p.prefill(prompt)
    assert draft.prefilled == [len(prompt)] * 2
    draft.missed = 2000
    for _ in range(100):  # a reply the draft model served well: it saved ~1.5 s
        p.observe(CycleReport(Plan(draft, 4), drafted=4, accepted=4, draft_s=0.008, verify_s=0.024))
    assert p.ledger.saved_by["draft"] > 1.0
    p.prefill(prompt)
    assert len(draft.prefilled) == 2  # 8 s to read is still more than it saved
    for _ in range(600):
        p.observe(CycleReport(Plan(draft, 4), drafted=4, accepted=4, draft_s=0.008, verify_s=0.024))
    p.prefill(prompt)
    assert len(draft.prefilled) == 3


def test_a_draft_model_is_warmed_for_what_the_other_drafters_left_in_the_last_reply():
    """An edit session: prompt lookup copied the whole last reply at twice plain
    speed. A draft model right most of the time would save time against plain
    decoding, but it has nothing left to win: reading the conversation into it
    (thousands of tokens, seconds) is lost. After a reply that lookup served in
    part, it is warmed for the rest."""
    def after_a_reply(lookup_cycles, plain_cycles):
        costs = Costs(CPU, {"draft": 0.010, "lookup": 0.0}, {"draft": 0.0003})  # 0.6 s to read 2,000 tokens
        draft = FakeDraftModel()
        p = AutoPolicy(costs, [PromptLookup(), draft], k_max=4, priors={"draft": 0.9, "lookup": 0.5})
        lookup = p.drafters[0]
        for _ in range(lookup_cycles):  # 5 tokens a 5-token pass
            p.observe(CycleReport(Plan(lookup, 4), drafted=4, accepted=4, draft_s=0.0, verify_s=CPU[5]))
        for _ in range(plain_cycles):
            p.observe(CycleReport(Plan(None, 0), drafted=0, accepted=0, draft_s=0.0, verify_s=CPU[1]))
        draft.missed = 2000
        p.prefill(list(range(1, 3001)))
        return p, draft

    p, draft = after_a_reply(600, 0)  # a 3,000-token edit, all copied
    assert draft.prefilled == []
    p, draft = after_a_reply(150, 2250)  # 3,000 tokens, a quarter copied
    assert draft.prefilled == [3000]


def test_a_cold_draft_model_is_not_probed_where_the_other_drafters_leave_it_nothing():
    """Mid-edit, prompt lookup has saved seconds; a probe of the cold draft model
    would spend them reading the conversation (thousands of tokens) for a reply
    that lookup copies, and the ledger, spent, would then hold lookup to short
    drafts for the rest of it (a 3,300-token turn at plain speed, seen on a 2-core
    CPU). Warm, it is used as before."""
    costs = Costs(CPU, {"draft": 0.010, "lookup": 0.0}, {"draft": 0.003})
    draft = FakeDraftModel()
    p = AutoPolicy(costs, [PromptLookup(), draft], k_max=4, priors={"draft": 0.9, "lookup": 0.5})
    lookup = p.drafters[0]
    for _ in range(400):  # the reply so far: all copied, 5 tokens a 5-token pass
        p.observe(CycleReport(Plan(lookup, 4), drafted=4, accepted=4, draft_s=0.0, verify_s=CPU[5]))
    assert p.ledger.credit > costs.catch_up("draft", 3000)  # the ledger could pay for the reading
    history = list(range(100, 130))  # nothing for lookup to copy in this cycle
    draft.missed = 3000
    p.probes.soon("draft", 0)
    assert p.plan(history).drafter is None
    draft.missed = 2
    assert p.plan(history).drafter is draft


def test_a_draft_model_is_not_warmed_for_savings_the_ledger_will_not_let_it_make():
    """A slow 2-core Xeon's costs: a 4-token pass is cheaper than a 3-token one, 1-token
    drafts do not pay, and the worst case of the 3-token ones that do (182 ms), with a
    1-token bet's after it, is more than a reply's first credit (136 ms): the ledger lets
    the model make no draft that pays until other drafters have saved. Read at the
    shipped prior (70%), the model sat idle and first replies ran 4-5% slower than plain
    decoding, beyond their ledger. Where a short draft the credit covers pays (a cheap
    draft step), its savings pay for the longer ones, and the model is read as before."""
    xeon = {1: .106, 2: .164, 3: .219, 4: .194, 5: .237, 8: .358, 9: .386, 16: .450, 17: .536}

    def warmed(draft_token_s):
        costs = Costs(xeon, {"draft": draft_token_s, "lookup": 0.0}, {"draft": .0093})
        draft = FakeDraftModel()
        draft.missed = 50  # a new prompt to read: 0.45 s
        p = AutoPolicy(costs, [PromptLookup(), draft], k_max=16, priors={"draft": 0.7, "lookup": 0.5})
        p.prefill(list(range(50)))
        return draft.prefilled == [50]

    assert not warmed(.0315)
    assert warmed(.005)


def test_a_draft_model_that_cannot_pay_even_when_right_is_left_cold():
    p = policy(CPU, CPU[1], prior=0.9)  # a draft token costs as much as a target token
    p.prefill([1, 2, 3, 4, 5, 6])
    assert p.drafters[1].prefilled == []


def test_a_near_tie_with_plain_decoding_stays_plain():
    """The best of several noisy estimates runs high: a drafter expected to be only
    2% faster than plain is not worth the risk, one expected 10% faster is."""
    costs = {1: 0.10, 2: 0.15}  # draft k=1: 0.15 s verify + 0.03 s drafting for 1 + a tokens

    def choice(acceptance):
        p = AutoPolicy(Costs(costs, {"draft": 0.03, "lookup": 0.0}), [PromptLookup(), FakeDraftModel()], k_max=1,
                       priors={"draft": acceptance, "lookup": 0.0})
        return p.plan([1, 2, 3, 4, 5, 6]).drafter

    assert (1 + 0.836) / 0.18 == pytest.approx(1.02 / 0.10, rel=1e-3)
    assert choice(0.836) is None
    assert choice(0.98) is not None and choice(0.98).name == "draft"


def test_a_draft_model_rated_high_keeps_its_standing_through_an_unsure_start():
    """Replies often start unsure (a code fence, a name): two declined guesses at
    the start of a reply must not bench a draft model that did well on the last."""
    p = AutoPolicy(Costs(THIS_CPU, {"draft": 0.024, "lookup": 0.0}), [PromptLookup(), FakeDraftModel()],
                   k_max=6, priors={"draft": 0.7, "lookup": 0.0})
    draft = p.drafters[1]
    for _ in range(40):  # the last reply: five right of six asked
        p.observe(CycleReport(Plan(draft, 6), drafted=6, accepted=5, draft_s=0.144, verify_s=0.258))
    history = [1, 2, 3, 4, 5, 6]
    p.prefill(history)
    for _ in range(2):  # the new reply opens unsure: the draft model declines twice
        plan = p.plan(history)
        assert plan.drafter is draft
        p.observe(CycleReport(plan, drafted=0, accepted=0, draft_s=0.024, verify_s=0.090))
    assert p.plan(history).drafter is draft


def test_a_draft_step_that_stopped_the_draft_is_a_step_too():
    costs = Costs({1: 0.1, 5: 0.2}, {"draft": 0.03})
    # Asked for 4, it drafted 2 and found the third guess too unsure: 3 steps in 0.09 s.
    costs.observe(CycleReport(Plan(FakeDraftModel(), 4), drafted=2, accepted=2, draft_s=0.09, verify_s=0.13,
                              caught_up=2))
    assert costs.draft("draft", 1) == pytest.approx(0.03)


def test_a_draft_model_that_declined_to_guess_still_cost_a_step():
    costs = Costs({1: 0.1, 5: 0.2}, {"draft": 0.03})
    # Unsure of its first guess (below p_min), the draft model drafted nothing, after a 0.05 s step.
    costs.observe(CycleReport(Plan(FakeDraftModel(), 4), drafted=0, accepted=0, draft_s=0.05, verify_s=0.1,
                              caught_up=2))
    assert costs.draft("draft", 1) == pytest.approx(0.03 + 0.2 * (0.05 - 0.03))


def test_how_sure_a_draft_model_must_be_follows_the_costs():
    """A guess costs a draft step and a verify column and saves a target pass when
    right: on this CPU (a column a third of a pass) the draft model should stop
    below about 60% sure; on a GPU, where a column is almost free, go on far
    less sure."""
    this_cpu = Costs({1: 0.090, 2: 0.124, 7: 0.258}, {"draft": 0.024})
    assert this_cpu.break_even("draft") == pytest.approx((0.024 + 0.028) / 0.090)
    gpu = Costs(GPU, {"draft": 0.002})
    assert gpu.break_even("draft") == pytest.approx((0.002 + 0.001) / 0.020)
    assert Costs({1: 0.1, 2: 0.3}, {"draft": 0.1}).break_even("draft") == 1.0  # never pays


def test_auto_hands_the_draft_model_its_break_even_confidence():
    p = policy(GPU, 0.002, prior=0.9)
    plan = p.plan([1, 2, 3, 4, 5, 6])
    assert plan.drafter.name == "draft" and plan.p_draft == pytest.approx(p.costs.break_even("draft"))
    lookup = policy(CPU, 0.010, prior=0.9).plan([9, 8, 7, 6, 5, 4, 3, 2, 1, 9, 8, 7])
    assert lookup.drafter.name == "lookup" and lookup.p_draft is None  # its proposal is made already


def test_a_drafter_that_could_not_pay_even_when_right_is_never_probed():
    p = policy(CPU, CPU[1], prior=0.9)  # a draft token costs as much as a target token
    assert not any(plan.kind == "probe" for plan in run(p, [1, 2, 3, 4, 5, 6], 2000))


def test_each_reply_has_its_own_exploration_budget():
    """What earlier replies saved is not spent on probing in this one: a reply
    loses at most the allowance of its own (expected) length, and what one
    drafter saved in the reply before, which that drafter may bet again."""
    p = policy(CPU, 0.010, prior=0.6)
    p.ledger.saved = 100.0  # a long, lucky reply
    p.prefill([1, 2, 3])
    assert p.ledger.saved == 0.0
    assert p.ledger.credit == pytest.approx(Ledger.ALLOWANCE * AutoPolicy.TYPICAL_REPLY * CPU[1] / 2)


def test_a_drafter_may_bet_again_what_it_saved_in_the_last_reply():
    """Short replies (an agent's tool calls) end before their own savings pay for
    drafts longer than a token or two: what a drafter saved in the last reply, and
    has not lost since, it may bet again, up to the allowance of a reply."""
    p = policy(CPU, 0.010, prior=0.6)
    allowance = Ledger.ALLOWANCE * AutoPolicy.TYPICAL_REPLY * CPU[1]
    p.ledger.saved_by.update(lookup=100.0, draft=-0.001)  # lookup served the last reply, the draft model lost
    p.prefill([1, 2, 3])
    assert p.ledger.carried == {"lookup": pytest.approx(allowance), "draft": 0.0}
    assert p.ledger.credit_for("lookup") == pytest.approx(1.5 * allowance)
    assert p.ledger.credit_for("draft") == pytest.approx(p.ledger.credit) == pytest.approx(allowance / 2)
    p.ledger.saved_by["lookup"] = -0.25 * allowance  # this reply lookup lost a quarter of it
    p.prefill([1, 2, 3])
    assert p.ledger.carried["lookup"] == pytest.approx(0.75 * allowance)


def test_what_a_reply_left_of_its_allowance_the_next_may_bet():
    """A slow CPU's 3-token draft risks more, if every guess is wrong, than the 1% of a
    reply the ledger lends at its start (the bundled draft on a 2-core Xeon: 132 ms
    against 104), and shorter drafts do not pay there: no draft is made, none saves, and
    so none was made in any later reply either. What a reply left of its allowance (2%
    of its plain time, less what it lost) the next may bet, beside what its drafters
    saved, up to one reply's allowance in all: a session falls no further behind plain
    decoding than its allowances, and a reply no further than two."""
    p = policy(CPU, 0.010, prior=0.6)
    allowance = Ledger.ALLOWANCE * AutoPolicy.TYPICAL_REPLY * CPU[1]
    for _ in range(AutoPolicy.TYPICAL_REPLY):  # a plain reply: nothing drafted, nothing lost
        p.observe(CycleReport(Plan(None, 0), drafted=0, accepted=0, draft_s=0.0, verify_s=CPU[1]))
    p.prefill([1, 2, 3])
    assert p.ledger.credit_for("draft") == pytest.approx(p.ledger.credit + allowance) == pytest.approx(1.5 * allowance)
    p.ledger.plain_s, p.ledger.saved = AutoPolicy.TYPICAL_REPLY * CPU[1], -0.25 * allowance
    p.ledger.saved_by.update(draft=-0.25 * allowance)
    p.prefill([1, 2, 3])  # a reply that lost a quarter of its allowance leaves the rest
    assert p.ledger.credit_for("draft") == pytest.approx(p.ledger.credit + 0.75 * allowance)
    p.ledger.plain_s, p.ledger.saved = AutoPolicy.TYPICAL_REPLY * CPU[1], 100.0
    p.ledger.saved_by.update(lookup=100.0)
    p.prefill([1, 2, 3])  # with what lookup saved, one reply's allowance in all
    assert p.ledger.credit_for("lookup") == pytest.approx(p.ledger.credit + allowance)

    xeon = Costs({1: .081, 2: .1157, 3: .1441, 4: .119, 5: .1711, 8: .2713, 9: .2997},
                 {"draft": .0314, "lookup": 0.0})
    p = AutoPolicy(xeon, [PromptLookup(), FakeDraftModel()], k_max=8, priors={"draft": 0.85, "lookup": 0.0})
    history = list(range(100, 160))
    assert p.plan(history).drafter is None  # 3 tokens would pay, but not from the first credit
    for _ in range(AutoPolicy.TYPICAL_REPLY):
        p.observe(CycleReport(Plan(None, 0), drafted=0, accepted=0, draft_s=0.0, verify_s=xeon.target_pass(1)))
    p.prefill(history)
    plan = p.plan(history)
    assert (plan.drafter.name, plan.k) == ("draft", 3)


def test_no_cycle_risks_more_than_the_ledger_can_lose():
    """A long lookup draft that would cost nine plain passes if wrong is not
    bet on a fresh reply, however sure auto is of it; once shorter drafts have
    saved enough, it is."""
    costs = Costs({1: 0.033, 2: 0.040, 9: 0.120, 17: 0.150}, {"draft": 0.011, "lookup": 0.0})
    p = AutoPolicy(costs, [PromptLookup()], k_max=16, priors={"lookup": 0.5})
    p.acceptance[Bucket("lookup", "8-gram")] = Acceptance(0.999, weight=100.0)
    history = list(range(40)) + list(range(20))  # the reply copies what came before
    fresh = p.plan(history)
    assert fresh.kind == "chosen" and 1 <= fresh.k <= 4  # a 5-token pass risks what a fresh reply can lose
    p.ledger.saved = p.ledger.saved_by["lookup"] = 1.0
    assert p.plan(history).k == 16
    p.prefill(history)  # the next reply (a short one, as an agent's): lookup bets again what it saved
    assert p.plan(history).k > fresh.k


def test_the_reason_is_worded_from_the_plan():
    p = policy(GPU, 0.002, prior=0.9)
    draft = p.drafters[1]
    chosen = Plan(draft, 4, bucket=Bucket("draft"), speedup=1.5, acceptance=0.9, p_draft=0.25)
    assert p.describe(chosen) == "draft k=4: 1.50x plain expected, acceptance 90%, drafting while 25% sure"
    lookup = Plan(p.drafters[0], 3, bucket=Bucket("lookup", "8-gram"), speedup=2.0, acceptance=0.5)
    assert p.describe(lookup) == "lookup/8-gram k=3: 2.00x plain expected, acceptance 50%"
    probe = Plan(draft, 2, bucket=Bucket("draft"), kind="probe", acceptance=0.4)
    assert p.describe(probe) == "probing draft: acceptance 40% may have changed"
    assert p.describe(Plan(None, 0)) == "plain: nothing to draft"
    unpaid = Plan(None, 0, declined=Plan(draft, 2, speedup=0.9))
    assert p.describe(unpaid) == "plain: drafting would not pay (best draft k=2: 0.90x)"
    risky = Plan(None, 0, declined=Plan(draft, 2, speedup=1.2))
    assert "ledger" in p.describe(risky)
    plan = p.plan([1, 2, 3, 4, 5, 6])
    assert plan.reason == p.describe(plan)


class FakeFreeDrafter(Drafter):
    """A new kind of drafter whose proposals cost nothing to make: auto knows it by its offer alone."""
    name = "suffix"

    def propose(self, history, k, params, rng):
        return Draft([7, 7, 7][:k])

    def offer(self, history, k_max):
        return Offer(3, "tail", [7, 7, 7])


def test_a_new_drafter_is_priced_and_scored_from_what_it_offers():
    chosen = AutoPolicy(Costs(GPU, {"suffix": 0.0}), [FakeFreeDrafter()], k_max=4, priors={"suffix": 0.9})
    plan = chosen.plan([1, 2, 3])
    assert (plan.kind, plan.name, plan.k, plan.bucket, plan.proposal, plan.p_draft) == (
        "chosen", "suffix", 3, Bucket("suffix", "tail"), [7, 7, 7], None)
    unused = AutoPolicy(Costs(CPU, {"suffix": 0.0}), [FakeFreeDrafter()], k_max=4, priors={"suffix": 0.3})
    assert unused.plan([1, 2, 3]).kind == "plain"
    unused.plan([1, 2, 3, 7, 7, 7])  # the cycle went as the unused proposal said
    assert unused.acceptance[Bucket("suffix", "tail")].rate > 0.7


def test_k_caps_every_drafter_auto_uses():
    """--k is the most tokens any cycle drafts, a free lookup proposal included."""
    costs = Costs({1: 0.010, 2: 0.0102, 17: 0.013}, {"draft": 0.002, "lookup": 0.0})
    p = AutoPolicy(costs, [PromptLookup(), FakeDraftModel()], k_max=2, priors={"lookup": 0.9, "draft": 0.9})
    p.acceptance[Bucket("lookup", "8-gram")] = Acceptance(0.999, weight=100.0)
    p.ledger.saved = 1.0
    history = list(range(40)) + list(range(20))  # the reply copies what came before: lookup could propose 20
    plan = p.plan(history)
    assert plan.name == "lookup" and plan.k == 2 and len(plan.proposal) <= 2


def test_a_probe_asks_for_what_the_ledger_can_pay():
    """On a CPU a 2-token probe risks more than a fresh reply lends: it asks for 1 instead of none."""
    p = policy(CPU, 0.010, prior=0.6)
    p.prefill([1, 2, 3, 4, 5, 6])
    assert p._worst_loss(p.drafters[1], AutoPolicy.PROBE_K, 0.0) > p.ledger.credit
    plans = [p.plan([1, 2, 3, 4, 5, 6]) for _ in range(AutoPolicy.PROBE_FIRST)]
    assert (plans[-1].kind, plans[-1].name, plans[-1].k) == ("probe", "draft", 1)


def test_a_long_draft_leaves_the_ledger_the_means_to_win_its_loss_back():
    """A bet the credit just covers is not taken when losing it would leave no
    credit for a 1-token draft; the 1-token draft itself may use it all."""
    costs = Costs({1: 0.030, 2: 0.040, 5: 0.070}, {"draft": 0.0, "lookup": 0.0})
    p = AutoPolicy(costs, [PromptLookup()], k_max=4, priors={"lookup": 0.5})
    p.acceptance[Bucket("lookup", "8-gram")] = Acceptance(0.95, weight=100.0)
    history = list(range(40)) + list(range(20))
    lent = p.ledger.credit
    p.ledger.saved = 0.045 - lent  # covers a 4-token draft's worst loss (40 ms), not it and a 1-token one's (10)
    assert p.plan(history).k == 3
    p.ledger.saved = 0.055 - lent
    assert p.plan(history).k == 4
    p.ledger.saved = 0.015 - lent
    assert p.plan(history).k == 1


def test_a_new_reply_starts_between_what_the_last_taught_and_the_prior():
    """What a chat reply taught of a draft model (rarely sure, often wrong) counts
    beside the prior again when a new reply, maybe code, begins."""
    a = Acceptance(0.7)
    for _ in range(40):
        a.observe(asked=3, drafted=0, accepted=0)
    assert a.rate < 0.01 and a.continuation < 0.01
    a.forget(2.0, prior=0.7)
    assert a.rate == pytest.approx(0.35, abs=0.01) and a.continuation == pytest.approx(0.5, abs=0.01)
    assert a.accepted + a.ended == pytest.approx(4.0)


def test_warming_is_priced_on_the_acceptance_this_reply_may_have():
    """At the prior a draft model saves nothing on this CPU; but a reply it is
    nearly always right on (code) would: warming it is worth a little, and less
    once many replies have shown it is not such a draft model."""
    costs = Costs(CPU, {"draft": 0.010, "lookup": 0.0}, {"draft": 0.003})
    p = AutoPolicy(costs, [PromptLookup(), FakeDraftModel()], k_max=4, priors={"draft": 0.6, "lookup": 0.5})
    draft = p.drafters[1]
    assert p._best_rate(draft, Acceptance(0.6)) < 1 / CPU[1]  # the point estimate saves nothing
    unsure = p._expected_saving(draft)
    assert unsure > 0
    p.acceptance[Bucket("draft")] = Acceptance(0.6, weight=200.0)
    assert p._expected_saving(draft) < unsure / 10


def test_a_reply_that_copies_long_runs_is_verified_in_long_passes():
    """Where a long pass costs less a token than a short one (a CPU: 65 tokens at
    19 ms a token, 17 at 25, one at 52) and the copy goes on, auto asks lookup for
    far more than 16 tokens; it prices lengths on a grid, up to k_max."""
    costs = Costs({1: 0.052, 2: 0.080, 17: 0.425, 65: 1.21}, {"draft": 0.011, "lookup": 0.0})
    p = AutoPolicy(costs, [PromptLookup()], k_max=64, priors={"lookup": 0.5})
    p.acceptance[Bucket("lookup", "8-gram")] = Acceptance(0.995, weight=100.0)
    p.ledger.saved = 10.0
    history = list(range(200)) + list(range(100))  # 100 tokens of a 200-token copy so far
    assert p.plan(history).k >= 48
    assert k_choices(64)[-1] == 64 and k_choices(10) == [1, 2, 3, 4, 6, 8, 10] and k_choices(0) == []

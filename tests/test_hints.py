"""A draft model reading prompt lookup's guesses as hints (drafters/hints.py): the
same draft, in fewer passes where the hints are its own guesses."""

from __future__ import annotations

import pytest

from edgespec.engine.drafters import DraftModel, PromptLookup
from edgespec.engine.drafters.hints import HintRule
from edgespec.engine.events import GenerationParams
from edgespec.engine.policy import FixedPolicy
from edgespec.engine.replay import ReplayedDraft, load_traces, machine_costs, replay
from edgespec.engine.runtime import Engine
from tests.test_engine import PROMPTS, settings
from tests.test_replay import TRACES

GREEDY = GenerationParams(temperature=0.0, p_min=0.0)


def measured(step_s: float, column_s: float) -> HintRule:
    rule = HintRule()
    rule.timed(1, step_s)
    rule.timed(5, step_s + 4 * column_s)
    return rule


def test_hints_are_read_as_far_as_agreement_pays_for_their_columns():
    """The n-th hint while agreement^n times a step is at least a column: at a coin
    toss's agreement, 3 where a column costs a tenth of a step (a GPU), 1 where half."""
    assert measured(0.010, 0.001).length(16) == 3
    assert measured(0.010, 0.005).length(16) == 1
    rule = measured(0.010, 0.001)
    for _ in range(30):
        rule.observe([5, 6, 7, 8], [5, 6, 7, 8, 9])  # the model agreed with every hint
    assert rule.agreement > 0.9
    assert rule.length(16) == 16
    for _ in range(30):
        rule.observe([5, 6, 7, 8], [1, 2, 3])  # and now with none
    assert rule.length(16) < 3


def test_hints_that_would_not_pay_are_still_read_now_and_then_to_measure_them():
    rule = measured(0.010, 0.009)
    for _ in range(30):
        rule.observe([5, 6], [1])
    lengths = [rule.length(8) for _ in range(3 * HintRule.PROBE_EVERY)]
    assert lengths.count(1) == 3 and lengths.count(0) == len(lengths) - 3


def test_a_draft_that_ended_before_the_hints_tells_nothing_of_those_past_its_end():
    rule = HintRule()
    before = rule.agreement
    rule.observe([5, 6, 7, 8], [5, 6])
    assert rule.ended == pytest.approx(HintRule.DECAY * (1 - HintRule.PRIOR) * HintRule.PRIOR_WEIGHT)
    assert rule.agreement > before


def test_lookup_over_a_list_shortened_in_place_finds_what_a_fresh_lookup_finds():
    text = [1, 2, 3, 4, 5, 6, 1, 2, 3, 9, 9, 1, 2]
    lookup = PromptLookup()
    lookup.lookup(text, 4)
    text += [3, 4]
    assert lookup.lookup(text, 4) == PromptLookup().lookup(list(text), 4)
    del text[11:]
    lookup.shortened(11)
    text += [9, 9]
    assert lookup.lookup(text, 4) == PromptLookup().lookup(list(text), 4) != []


class Scripted:
    """Hints from a script: what follows `history` in `text` (right: the model's own draft)."""

    def __init__(self, history, text):
        self.history, self.text = list(history), list(text)

    def lookup(self, text, k):
        return self.text[len(text) - len(self.history):][:k]

    def shortened(self, n):
        pass


@pytest.fixture(scope="module")
def same(synth_target):
    engine = Engine.load(settings(synth_target), settings(synth_target))
    yield engine.draft_seq
    engine.close()


def test_a_draft_model_reading_its_own_guesses_as_hints_drafts_them_in_one_pass(same):
    history = PROMPTS[4]
    alone = DraftModel(same).propose(history, 8, GREEDY, None)
    assert len(alone.tokens) == 8 and alone.passes == 8
    model = DraftModel(same, hints=Scripted(history, alone.tokens))
    model.hint_rule = measured(0.010, 0.001)
    for _ in range(30):
        model.hint_rule.observe([1, 2, 3, 4, 5, 6, 7, 8], [1, 2, 3, 4, 5, 6, 7, 8, 9])
    hinted = model.propose(history, 8, GREEDY, None)
    assert hinted.tokens == alone.tokens
    assert hinted.passes == 1 and hinted.hints == 8
    assert same.tokens[: len(history)] == history


def test_hints_the_draft_model_does_not_agree_with_cost_passes_not_tokens(same):
    history = PROMPTS[4]
    alone = DraftModel(same).propose(history, 6, GREEDY, None)
    wrong = [t + 1 for t in alone.tokens]
    hinted = DraftModel(same, hints=Scripted(history, wrong)).propose(history, 6, GREEDY, None)
    assert hinted.tokens == alone.tokens
    assert hinted.passes == 6


def test_a_draft_model_with_prompt_lookup_hints_drafts_what_it_drafts_alone(same):
    """Real hints: a history that repeats itself, so that lookup guesses at every step."""
    history = [*PROMPTS[3], *PROMPTS[3][1:], *PROMPTS[3][1:4]]
    alone = DraftModel(same).propose(history, 10, GREEDY, None)
    model = DraftModel(same, hints=PromptLookup())
    for _ in range(3):  # again, with the hint rule's measurements from the last
        hinted = model.propose(history, 10, GREEDY, None)
        assert hinted.tokens == alone.tokens
        assert hinted.passes <= alone.passes
        model.rewind(history)


def test_hints_make_the_replayed_draft_model_cheaper_not_different():
    """On a GPU's costs (a column a tenth of a step) a fixed draft mode copies an edit
    faster with hints; no reply takes longer, and what is accepted is the same."""
    costs = machine_costs("gpu")
    with_hints, without = ReplayedDraft(costs), ReplayedDraft(costs, hints=False)
    seconds = {}
    for trace in load_traces(TRACES):
        seconds[trace.name] = [replay(FixedPolicy(d, 8), trace, costs, d) for d in (with_hints, without)]
    assert all(h <= alone * (1 + 1e-9) for h, alone in seconds.values()), seconds
    hinted, alone = seconds["fix-typo"]
    assert hinted < 0.8 * alone

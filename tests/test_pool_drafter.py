"""The drafter that remembers (engine/drafters/pool_lookup.py) and how auto prices it, on
made-up token streams; the engine's remember/forget on a synthetic model."""

from __future__ import annotations

import numpy as np
import pytest

from edgespec.engine.auto import AutoPolicy
from edgespec.engine.costs import Costs
from edgespec.engine.drafters import Draft, Drafter, Offer
from edgespec.engine.drafters.pool_lookup import PoolLookup
from edgespec.engine.events import GenerationParams
from edgespec.engine.policy import Bucket, CycleReport
from edgespec.engine.runtime import CacheSettings, Engine, ModelSettings
from edgespec.engine.suffix import SuffixIndex
from tests.synthetic import FIRST_WORD as W

EARLIER = list(range(100, 160))
"""An earlier reply: 60 distinct tokens."""


def _pool(*docs: tuple[str, list[int]]) -> SuffixIndex:
    index = SuffixIndex()
    for name, tokens in docs:
        index.add(name, tokens)
    return index


def test_a_reply_repeating_earlier_text_is_offered_its_continuation_with_its_source():
    drafter = PoolLookup(_pool(("conversation:7", EARLIER)))
    history = [1, 2, 3, *EARLIER[:20]]
    offer = drafter.offer(history, 8)
    assert offer.proposal == EARLIER[20:28] and offer.k_max == 8
    assert (offer.key, offer.source) == ("long", "pool/conversation")
    draft = drafter.propose(history, 4, GenerationParams(), np.random.default_rng(0))
    assert (draft.tokens, draft.source, draft.probs) == (EARLIER[20:24], "pool/conversation", None)


def test_a_short_match_is_its_own_key_and_too_short_a_match_offers_nothing():
    drafter = PoolLookup(_pool(("request:ab", EARLIER)))
    short = drafter.offer([1, 2, *EARLIER[:PoolLookup.MIN_MATCH]], 8)
    assert (short.key, short.source) == ("short", "pool/request")
    assert short.proposal == EARLIER[PoolLookup.MIN_MATCH:][:short.k_max] and short.k_max > 0
    none = drafter.offer([1, 2, *EARLIER[:PoolLookup.MIN_MATCH - 1]], 8)
    assert (none.k_max, none.proposal) == (0, [])


def test_weak_evidence_offers_nothing():
    """Of four earlier places, each went on differently: no continuation is likely enough."""
    prefix = [5, 6, 7, 8, 9]
    index = _pool(*((f"conversation:{i}", [*prefix, 50 + i, 60 + i]) for i in range(4)))
    assert PoolLookup(index).offer([1, *prefix], 8).k_max == 0


def test_without_a_pool_nothing_is_offered():
    assert PoolLookup(None).offer([1, 2, 3], 8).k_max == 0
    assert PoolLookup(SuffixIndex()).offer([1, 2, 3], 8).k_max == 0


CPU = {1: 0.028, 2: 0.040, 5: 0.076}


class AlwaysWrong(Drafter):
    """A free drafter that offers a wrong proposal every cycle, listed before the pool."""
    name = "lookup"

    def propose(self, history, k, params, rng):
        return Draft([0] * k)

    def offer(self, history, k_max):
        return Offer(k_max, "4-gram", [0] * k_max)


def _run(auto: AutoPolicy, history: list[int], copied: list[int], n: int, *, start: int) -> list:
    """n cycles in which the model writes `copied` on from `start`; each plan observed
    as the target would have judged it."""
    plans = []
    at = start
    for _ in range(n):
        plan = auto.plan(history)
        plans.append(plan)
        proposal = plan.proposal or []
        k = plan.k if plan.drafter else 0
        right = next((i for i in range(k) if proposal[i] != copied[at + i]), k)
        auto.observe(CycleReport(plan, drafted=k, accepted=right, draft_s=0.0,
                                 verify_s=auto.costs.target_pass(k + 1)))
        history += copied[at:at + right + 1]
        at += right + 1
    return plans


def test_auto_scores_every_unused_free_proposal_so_a_pool_that_helps_is_chosen():
    """Another free drafter offers something every cycle, and the pool too: both are
    scored against what was generated, and the pool, always right, is chosen."""
    copied = list(range(200, 300))
    pool = PoolLookup(_pool(("conversation:1", copied)))
    costs = Costs(CPU, {"lookup": 0.0, "pool": 0.0})
    auto = AutoPolicy(costs, [AlwaysWrong(), pool], k_max=4, priors={"lookup": 0.3, "pool": 0.3})
    plans = _run(auto, [7, 8, *copied[:20]], copied, 12, start=20)
    assert plans[0].drafter is None
    assert auto.acceptance[Bucket("pool", "long")].rate > 0.7
    assert plans[-1].drafter is pool and plans[-1].source == "pool/conversation"


def test_a_pool_that_stops_helping_is_dropped():
    """Every pool draft rejected: auto goes back to plain decoding after a few cycles."""
    pool = PoolLookup(_pool(("conversation:1", list(range(200, 260)))))
    auto = AutoPolicy(Costs(CPU, {"pool": 0.0}), [pool], k_max=4, priors={"pool": 0.9})
    history = list(range(200, 230))
    plans = []
    for _ in range(12):
        plan = auto.plan(history)
        plans.append(plan)
        k = plan.k if plan.drafter else 0
        auto.observe(CycleReport(plan, drafted=k, accepted=0, draft_s=0.0, verify_s=auto.costs.target_pass(k + 1)))
    assert plans[0].drafter is pool
    assert plans[-1].drafter is None


# --- the engine: remember, forget, kept between runs (synthetic models) ------------------

def _load(path, folder, *, mib=1):
    return Engine.load(ModelSettings(path, n_ctx=256, n_threads=1, n_batch=64),
                       cache=CacheSettings(pool=folder, pool_mib=mib))


def _generate(engine, prompt, **kw):
    tokens, last = [], None
    for last in engine.generate(prompt, GenerationParams(**kw)):
        tokens += last.tokens
    return tokens, last.stats


PROMPT = [1, *range(W + 30, W + 58)]


def _steady(engine) -> None:
    """Auto mode calibrated as on a machine where a verify column costs little (a GPU),
    at this machine's single pass, instead of from a few passes timed on a busy test
    machine (the rates then vary from run to run): these tests are about the pool."""
    from edgespec.engine.costs import measure_pass

    single = measure_pass(engine.target_seq, 1, repeats=5)
    engine.auto(GenerationParams(mode="auto", k=4)).costs = Costs(
        {1: single, 2: 1.05 * single, 5: 1.2 * single}, {"lookup": 0.0, "pool": 0.0})


def test_a_reply_remembered_is_drafted_from_the_pool_the_next_run_and_changes_nothing(synth_target, tmp_path):
    with _load(synth_target, tmp_path / "pool") as engine:
        plain, _ = _generate(engine, PROMPT, mode="plain", max_tokens=60)
        engine.remember("conversation:1", [*PROMPT, *plain])
    with _load(synth_target, tmp_path / "pool") as engine:  # a new run: read from the file
        _steady(engine)
        again, stats = _generate(engine, PROMPT, mode="auto", k=4, max_tokens=60)
    assert again == plain
    assert stats.accepted_by.get("pool/conversation", 0) > 0  # how many: auto's choice, from timings


def test_a_forgotten_document_is_gone_from_the_engine_and_its_file(synth_target, tmp_path):
    with _load(synth_target, tmp_path / "pool") as engine:
        engine.remember("conversation:1", PROMPT)
        engine.remember("conversation:2", PROMPT[::-1])
        pool = next(d for d in engine.drafters if isinstance(d, PoolLookup))
        engine.forget("conversation:1")
        _generate(engine, PROMPT, mode="plain", max_tokens=2)  # the next reply drafts without it
        assert pool.index.documents() == ["conversation:2"]
    with _load(synth_target, tmp_path / "pool") as engine:
        pool = next(d for d in engine.drafters if isinstance(d, PoolLookup))
        assert pool.index.documents() == ["conversation:2"]


def test_forgetting_reaches_the_file_while_the_pool_is_off(synth_target, tmp_path):
    with _load(synth_target, tmp_path / "pool") as engine:
        engine.remember("conversation:1", PROMPT)
    with _load(synth_target, tmp_path / "pool", mib=0) as engine:
        assert not any(isinstance(d, PoolLookup) for d in engine.drafters)
        engine.remember("conversation:2", PROMPT)  # off: nothing kept
        engine.forget("conversation:1")
    with _load(synth_target, tmp_path / "pool") as engine:
        pool = next(d for d in engine.drafters if isinstance(d, PoolLookup))
        assert pool.index.documents() == []


def test_a_pool_from_another_tokenizer_is_not_used(synth_target, synth_other_vocab, tmp_path):
    with _load(synth_target, tmp_path / "pool") as engine:
        engine.remember("conversation:1", PROMPT)
    with _load(synth_other_vocab, tmp_path / "pool") as engine:
        pool = next(d for d in engine.drafters if isinstance(d, PoolLookup))
        assert pool.index.documents() == []
    assert len(list((tmp_path / "pool").glob("*.pool"))) == 1  # the other's is written only once it holds something


@pytest.mark.slow
def test_smollm2_drafts_an_answer_given_before_from_the_pool_and_changes_nothing(smollm2, tmp_path):
    """A conversation asks what an earlier one asked (another system prompt): its reply,
    remembered, is drafted from the pool and accepted; greedy output is plain greedy's."""
    from edgespec.chat.template import chat_template

    def chat(engine, system):
        messages = [{"role": "system", "content": system}, {"role": "user", "content": QUESTION}]
        return engine.tokenize(chat_template(engine).render(messages), special=True)

    settings = ModelSettings(smollm2, n_ctx=1024, exact=True)
    with Engine.load(settings, cache=CacheSettings(pool=tmp_path / "pool", pool_mib=8)) as engine:
        first = chat(engine, "You are a helpful assistant.")
        plain, _ = _generate(engine, first, mode="plain", max_tokens=64)
        engine.remember("conversation:1", [*first, *plain])
        second = chat(engine, "Be precise.")
        expected, _ = _generate(engine, second, mode="plain", max_tokens=64)
        engine.reset()
        _steady(engine)
        again, stats = _generate(engine, second, mode="auto", k=4, max_tokens=64)
    assert again == expected
    assert stats.accepted_by.get("pool/conversation", 0) > 0


QUESTION = "Write a Python function that returns the n-th Fibonacci number, with a docstring."


def test_a_long_running_engine_saves_the_pool_now_and_then_after_a_reply(synth_target, tmp_path, monkeypatch):
    from edgespec.engine import runtime
    from edgespec.engine.pool import Pool

    with _load(synth_target, tmp_path / "pool") as engine:
        engine.remember("request:a", PROMPT)
        assert not list((tmp_path / "pool").glob("*.pool"))  # not yet: saved at close, or after POOL_SAVE_S
        monkeypatch.setattr(runtime, "POOL_SAVE_S", 0.0)
        engine.remember("request:b", PROMPT[::-1])
        (path,) = (tmp_path / "pool").glob("*.pool")
        assert Pool.open(tmp_path / "pool", path.stem).index.documents() == ["request:a", "request:b"]

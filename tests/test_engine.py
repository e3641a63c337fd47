"""The engine on real llama.cpp contexts (synthetic GGUF models: milliseconds each)."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest

from edgespec.engine.costs import calibrate, pass_sizes
from edgespec.engine.detok import Detokenizer
from edgespec.engine.events import GenerationParams
from edgespec.engine.runtime import CacheSettings, Engine, ModelSettings
from edgespec.errors import ContextFullError, IncompatibleDraftError, ModelFileError
from tests.synthetic import FIRST_WORD

W = FIRST_WORD  # id of the first word token
PROMPTS = [
    [1],
    [1, W + 4],
    [1, *range(W + 1, W + 8)],
    [1, W + 20, W + 21, W + 20, W + 21, W + 20, W + 21, W + 20],
    [1, *range(W + 30, W + 58)],
]


def settings(path, **kw):
    return ModelSettings(path, n_ctx=kw.pop("n_ctx", 256), n_threads=1, n_batch=64, **kw)


@pytest.fixture(scope="module")
def engines(synth_target, synth_far_draft, synth_near_draft):
    """The target paired with three drafts: unrelated, close, and itself."""
    made = {
        "far": Engine.load(settings(synth_target), settings(synth_far_draft)),
        "near": Engine.load(settings(synth_target), settings(synth_near_draft)),
        "same": Engine.load(settings(synth_target), settings(synth_target)),
    }
    yield made
    for e in made.values():
        e.close()


def run(engine, prompt, **kw):
    tokens, flags, last = [], [], None
    for chunk in engine.generate(prompt, GenerationParams(**kw)):
        tokens += chunk.tokens
        flags += chunk.from_draft
        last = chunk
    return tokens, flags, last


@pytest.mark.parametrize("pair", ["far", "near", "same"])
def test_greedy_speculation_equals_plain_greedy(engines, pair):
    engine = engines[pair]
    for prompt in PROMPTS:
        plain, _, _ = run(engine, prompt, mode="plain", max_tokens=40)
        assert len(plain) == 40
        for k in range(1, 9):
            spec, flags, last = run(engine, prompt, mode="draft", k=k, max_tokens=40)
            assert spec == plain, f"prompt {prompt}, k={k}"
            assert len(flags) == len(spec)
            assert last.stats.accepted == sum(flags)
            assert last.stats.target_passes < len(spec) or last.stats.accepted == 0


def test_acceptance_pattern_follows_the_draft(engines):
    """Draft = target accepts every draft token; an unrelated draft few."""
    _, _, same = run(engines["same"], PROMPTS[2], mode="draft", k=4, max_tokens=40, p_min=0.0)
    assert same.stats.drafted > 0 and same.stats.accepted == same.stats.drafted
    assert same.stats.tokens_per_pass > 4
    _, _, far = run(engines["far"], PROMPTS[2], mode="draft", k=4, max_tokens=40, p_min=0.0)
    _, _, near = run(engines["near"], PROMPTS[2], mode="draft", k=4, max_tokens=40, p_min=0.0)
    assert far.stats.acceptance_rate < near.stats.acceptance_rate < 1.0


def test_the_first_token_comes_from_the_prompts_own_pass(engines, monkeypatch):
    """As in llama.cpp's loops: a pass of its own, or drafts verified with it,
    would delay the first token. The prompt's last token is read with the rest
    of the prompt (again on its own when all of it is cached, for its logits),
    and drafting starts after."""
    engine = engines["same"]
    engine.reset()
    seq, passes = engine.target_seq, []
    extend = seq.extend
    monkeypatch.setattr(seq, "extend", lambda tokens, **kw: (passes.append(len(tokens)), extend(tokens, **kw))[1])
    params = GenerationParams(mode="draft", k=4, max_tokens=9, p_min=0.0)
    for read in (len(PROMPTS[2]), 1):  # the second time, all of the prompt is cached
        passes.clear()
        cycles = [(len(c.tokens), c.stats.drafted) for c in engine.generate(PROMPTS[2], params)]
        # then 4 drafts and the target's token; then 2 (all max_tokens leaves room for) and its token
        assert cycles == [(1, 0), (5, 4), (3, 6)]  # (tokens in the cycle, drafted so far)
        assert passes == [read, 5, 3]


def test_cycles_report_the_draft_length_asked_for(engines, monkeypatch):
    """A draft model unsure of its next guess (below p_min) stops early: the policy
    must be told it was asked for more, and near max_tokens k is cut."""
    from edgespec.engine.policy import FixedPolicy

    engine, reports = engines["near"], []

    class Recording(FixedPolicy):
        def observe(self, report):
            reports.append(report)

    monkeypatch.setattr(engine, "policy", lambda params: Recording(engine.draft_model, 4))
    _, _, last = run(engine, PROMPTS[2], mode="draft", k=4, max_tokens=30, p_min=0.6)
    assert last.stats.stop_reason == "max_tokens"
    produced = 1  # the first token comes from the prompt's pass, not a cycle
    for r in reports:
        assert r.asked == min(4, 30 - produced - 1)
        assert r.stopped == (r.drafted < r.asked)
        produced += r.accepted + 1
    assert reports[-1].asked < 4
    assert any(r.stopped for r in reports) and any(not r.stopped and r.drafted for r in reports)


def test_a_plans_p_draft_is_the_one_the_draft_model_drafts_with(engines, monkeypatch):
    """Auto mode sets how sure the draft model must be of its whole draft, per
    cycle (from the costs); the decoder hands it to the draft model."""
    from edgespec.engine.policy import Plan, Policy

    engine = engines["near"]

    class Sure(Policy):
        """The draft model, k = 4, drafting while its whole draft is `p_draft` sure."""

        def __init__(self, p_draft):
            self.p_draft = p_draft

        def plan(self, history):
            return Plan(engine.draft_model, 4, p_draft=self.p_draft)

        def prefill(self, prompt):
            engine.draft_model.prefill(prompt)

    def drafted(p_draft):
        monkeypatch.setattr(engine, "policy", lambda params: Sure(p_draft))
        engine.reset()
        return run(engine, PROMPTS[2], mode="draft", k=4, max_tokens=30, p_min=0.0)[2].stats.drafted

    assert drafted(1.01) == 0 < drafted(0.5) < drafted(0.0)


def test_draft_model_reports_how_far_it_had_to_catch_up(engines):
    engine = engines["same"]
    drafter, params = engine.draft_model, GenerationParams(k=4, p_min=0.0)
    engine.reset()
    history = list(PROMPTS[4])
    first = drafter.propose(history, 4, params, None)
    assert first.caught_up == len(history)  # a cold cache reads everything
    history += first.tokens + [W]  # all accepted, and the target's own token
    drafter.rewind(history)
    assert drafter.propose(history, 4, params, None).caught_up == 2  # the last draft token and the target's


def draft_catch_ups(engine, monkeypatch) -> list[int]:
    """What each draft of the engine's draft model read before drafting (Draft.caught_up), as they come."""
    caught_up = []
    propose = type(engine.draft_model).propose

    def spy(self, *args, **kwargs):
        draft = propose(self, *args, **kwargs)
        caught_up.append(draft.caught_up)
        return draft

    monkeypatch.setattr(type(engine.draft_model), "propose", spy)
    return caught_up


def test_the_draft_model_reads_the_prompt_before_its_first_draft(engines, monkeypatch):
    """Once the first token is out, so that drafting starts with a warm draft
    model (its first draft reads only the first token, as the target's first
    pass does) and the first token does not wait for it."""
    engine = engines["same"]
    engine.reset()
    caught_up = draft_catch_ups(engine, monkeypatch)
    run(engine, PROMPTS[4], mode="draft", k=4, max_tokens=10)
    assert len(PROMPTS[4]) > 2 and caught_up[0] == 1


def test_reading_ahead_fills_the_caches_a_reply_then_reads_only_the_rest_of(engines, monkeypatch):
    """Engine.read (the chat reading a message while it is written): the target
    and, where the reply's mode drafts with it, the draft model hold the tokens,
    and the reply to a prompt that starts with them reads only what follows, in
    both; its output is what it would have been."""
    engine = engines["same"]
    prompt = PROMPTS[4]
    engine.reset()
    expected, _, _ = run(engine, prompt, mode="draft", k=4, max_tokens=10)
    engine.reset()
    chunks = list(engine.read(prompt[:-3], GenerationParams(mode="plain")))
    assert chunks and engine.target_seq.tokens == prompt[:-3] and engine.draft_seq.tokens == []  # plain drafts nothing
    engine.reset()
    list(engine.read(prompt[:-3], GenerationParams(mode="draft", k=4)))
    assert engine.target_seq.tokens == engine.draft_seq.tokens == prompt[:-3]
    caught_up = draft_catch_ups(engine, monkeypatch)
    before = engine.draft_seq.evaluated
    tokens, _, last = run(engine, prompt, mode="draft", k=4, max_tokens=10)
    assert tokens == expected and last.stats.prompt_evaluated == 3
    assert caught_up[0] == 1  # the reply's prompt was read by the draft model too, before the first draft
    assert engine.draft_seq.evaluated - before <= 3 + sum(caught_up) + 4 * len(caught_up)


def test_a_message_sent_stops_the_draft_models_reading_ahead_not_the_targets_nor_a_reply(engines, monkeypatch):
    """interrupt_drafters_reading(): a message sent while the draft model catches up
    with a reply (seconds at a long context on a CPU, for a model the next reply may
    leave out) does not wait for it, nor for one about to begin; the target's reading
    of what the message needs goes on, and a reply is never stopped by it."""
    engine = engines["same"]
    prompt = PROMPTS[4]
    engine.reset()
    drafter = type(engine.draft_model)
    prefill = drafter.prefill

    def sent_meanwhile(self, tokens):
        engine.interrupt_drafters_reading()  # what the app does when a message is sent now
        prefill(self, tokens)

    monkeypatch.setattr(drafter, "prefill", sent_meanwhile)
    list(engine.read(prompt, GenerationParams(mode="draft", k=4)))
    assert engine.target_seq.tokens == prompt and engine.draft_seq.tokens != prompt
    monkeypatch.setattr(drafter, "prefill", prefill)
    engine.reset()
    for chunk in engine.read(prompt, GenerationParams(mode="draft", k=4)):  # sent while the target reads
        engine.interrupt_drafters_reading()
        assert chunk.finish_reason != "cancelled"
    assert engine.target_seq.tokens == prompt and engine.draft_seq.tokens == []  # the draft model did not begin
    engine.interrupt_drafters_reading()  # between readings: nothing to stop, and nothing kept for the next one
    list(engine.read(prompt, GenerationParams(mode="draft", k=4)))
    assert engine.draft_seq.tokens == prompt
    expected, _, _ = run(engine, prompt, mode="draft", k=4, max_tokens=12)
    tokens = []
    for chunk in engine.generate(prompt, GenerationParams(mode="draft", k=4, max_tokens=12)):
        engine.interrupt_drafters_reading()
        tokens += chunk.tokens
    assert tokens == expected


def test_calibration_measures_costs_and_leaves_the_caches_as_they_were(engines, synth_target):
    engine = engines["same"]
    engine.reset()
    run(engine, PROMPTS[2], mode="draft", k=4, max_tokens=5)
    target, draft = engine.target_seq, engine.draft_seq
    before = (list(target.tokens), list(draft.tokens))
    costs = calibrate(target, draft, 4)
    assert set(costs.target) == {1, 2, 3, 4, 5} and all(s > 0 for s in costs.target.values())
    assert costs.per_draft_token["draft"] > 0 and costs.per_catch_up_token["draft"] > 0
    assert (target.tokens, draft.tokens) == before
    # A nearly full context: only what fits is measured.
    with Engine.load(settings(synth_target, n_ctx=32), settings(synth_target, n_ctx=32)) as small:
        t, d = small.target_seq, small.draft_seq
        t.sync(list(range(1, t.n_ctx - 3)))
        d.sync(list(range(1, d.n_ctx - 3)))
        costs = calibrate(t, d, 6)
        assert set(costs.target) == {n for n in pass_sizes(6) if n <= t.room} == {1, 2, 3, 4}
        assert costs.per_catch_up_token["draft"] > 0


def test_a_first_auto_reply_at_a_nearly_full_context_does_not_keep_auto_from_drafting_later(synth_target):
    """Its calibration measures only the passes that fit then; the sizes it could not
    measure are measured by a later reply that has room for them (auto priced every
    draft from one-token passes for the rest of the process, and never drafted)."""
    with Engine.load(settings(synth_target), settings(synth_target)) as engine:
        params = GenerationParams(mode="auto", k=8, max_tokens=None)
        run(engine, [1] + [W + i % 7 for i in range(engine.n_ctx - 3)], **vars(params))
        params.max_tokens = 40
        drafted = sum(run(engine, PROMPTS[3], **vars(params))[2].stats.drafted for _ in range(3))
        assert set(pass_sizes(8)) <= set(engine.auto(params).costs.calibrated)
        assert drafted > 0  # the draft is the target: every guess is right


def test_a_calibration_kept_from_a_busy_moment_is_kept_lower_once_a_process_saw_faster_passes(
        synth_target, tmp_path):
    """A calibration measured while the machine was busy would price drafts wrong in every
    later process: a process that saw faster passes keeps them, at its close."""
    cache = CacheSettings(ram_mib=0, disk=tmp_path)  # the calibration kept beside the snapshots
    params = GenerationParams(mode="auto", k=4, max_tokens=20)
    model = settings(synth_target, flash_attn=False)  # (not probed: beside the point)
    with Engine.load(model, model, cache=cache) as engine:
        run(engine, PROMPTS[3], **vars(params))  # calibrated, and kept
    (kept,) = (tmp_path / "costs").glob("*.json")
    busy = json.loads(kept.read_text())
    busy["target"] = {n: 10.0 for n in busy["target"]}  # a pass of any size: 10 s
    kept.write_text(json.dumps(busy))
    with Engine.load(model, model, cache=cache) as engine:
        run(engine, PROMPTS[3], **vars(params))
        assert json.loads(kept.read_text()) == busy  # not rewritten on a reply's path
    healed = json.loads(kept.read_text())
    assert healed["target"]["1"] < 1.0 and all(t <= 10.0 for t in healed["target"].values())
    assert healed["target"].keys() == busy["target"].keys()
    assert (healed["per_draft_token"], healed["per_catch_up_token"]) == (
        busy["per_draft_token"], busy["per_catch_up_token"])


def test_a_kept_calibration_without_a_reading_price_measures_the_draft_model_again(synth_target, tmp_path):
    """A calibration kept by an earlier version priced the draft model's reading with
    every token's logits: its reading price is not used, the draft model is measured
    again (a second) and kept, its target passes as they were (measuring them takes seconds)."""
    cache = CacheSettings(ram_mib=0, disk=tmp_path)
    params = GenerationParams(mode="auto", k=4, max_tokens=5)
    model = settings(synth_target, flash_attn=False)
    with Engine.load(model, model, cache=cache) as engine:
        run(engine, PROMPTS[3], **vars(params))
    (kept,) = (tmp_path / "costs").glob("*.json")
    old = json.loads(kept.read_text())
    old.pop("reading_logits")
    old["target"] = {n: 10.0 for n in old["target"]}
    old["per_catch_up_token"] = {"draft": 10.0}
    kept.write_text(json.dumps(old))
    with Engine.load(model, model, cache=cache) as engine:
        run(engine, PROMPTS[3], **vars(params))
        assert engine.auto(params).costs.per_catch_up_token["draft"] < 1.0
        again = json.loads(kept.read_text())  # (before the close heals what the reply ran)
        assert again["reading_logits"] == "last" and again["per_catch_up_token"]["draft"] < 1.0
        assert again["target"] == old["target"]


def test_reset_with_learnt_starts_auto_over_as_a_new_process_would(engines):
    """Engine.reset(learnt=True) (bench --first-replies): the caches emptied, and auto
    back at its priors with no reply seen, on the calibration it measured."""
    engine = engines["near"]
    params = GenerationParams(mode="auto", max_tokens=12)
    for _ in engine.generate(PROMPTS[4], params):
        pass
    auto = engine.auto(params)
    assert auto.ledger.plain_s > 0 and auto.acceptance
    engine.reset()
    assert engine.auto(params) is auto  # the caches alone
    engine.reset(learnt=True)
    fresh = engine.auto(params)
    assert fresh is not auto and not fresh.acceptance and fresh.ledger.plain_s == 0
    assert fresh.costs.target == auto.costs.calibrated and fresh.k_max == auto.k_max
    assert engine.target_seq.tokens == [] and engine.draft_seq.tokens == []


def test_prompt_lookup_greedy_equals_plain(engines):
    engine = engines["far"]
    for prompt in PROMPTS:
        plain, _, _ = run(engine, prompt, mode="plain", max_tokens=60)
        for k in (1, 3, 8):
            spec, flags, last = run(engine, prompt, mode="lookup", k=k, max_tokens=60)
            assert spec == plain
    # Random models fall into loops, which lookup then predicts.
    _, _, last = run(engine, PROMPTS[3], mode="lookup", k=8, max_tokens=60)
    assert last.stats.accepted > 0


def fresh_logits(path, tokens):
    """Logits after `tokens` from a new context (same kernels and KV type as the engine's)."""
    with Engine.load(settings(path)) as engine:
        return engine.target_seq.next_logits(tokens).copy()


def test_kv_truncation_leaves_both_caches_as_if_fed_only_the_accepted_tokens(
        synth_target, synth_far_draft):
    engine = Engine.load(settings(synth_target), settings(synth_far_draft))
    try:
        prompt = PROMPTS[2]
        chunks = engine.generate(prompt, GenerationParams(mode="draft", k=6, max_tokens=200, p_min=0.0))
        history = list(prompt)
        for chunk in chunks:
            history += chunk.tokens
            if chunk.stats.drafted and not all(chunk.from_draft):  # a cycle (not the first token) had a rejection
                break
        chunks.close()
        target_seq, draft_seq = engine.target_seq, engine.draft_seq
        # The target holds everything but the newest token; the draft a prefix of the history.
        assert target_seq.tokens == history[:-1]
        assert draft_seq.tokens == history[: len(draft_seq.tokens)]
        assert len(draft_seq.tokens) >= len(history) - 2
        for seq, path in ((target_seq, synth_target), (draft_seq, synth_far_draft)):
            got = seq.next_logits(history).copy()
            # A stale (rejected) entry left in the cache would move logits by O(1); the
            # fresh context differs only by batch rounding.
            np.testing.assert_allclose(got, fresh_logits(path, history), rtol=0, atol=0.05)
    finally:
        engine.close()


def test_stopping_early_leaves_caches_consistent(engines):
    engine = engines["near"]
    expected, _, _ = run(engine, PROMPTS[4], mode="draft", k=4, max_tokens=30)
    chunks = engine.generate(PROMPTS[4], GenerationParams(mode="draft", k=4, max_tokens=30))
    next(chunks)
    next(chunks)
    chunks.close()
    again, _, _ = run(engine, PROMPTS[4], mode="draft", k=4, max_tokens=30)
    assert again == expected


def test_cache_reuse_evaluates_only_the_new_suffix(engines):
    engine = engines["same"]
    engine.reset()
    first, _, a = run(engine, PROMPTS[4], mode="plain", max_tokens=5)
    assert a.stats.prompt_evaluated == len(PROMPTS[4])
    longer = PROMPTS[4] + first + [W + 40, W + 41]
    _, _, b = run(engine, longer, mode="plain", max_tokens=5)
    assert b.stats.prompt_evaluated <= 3  # the two new tokens, and perhaps the last generated one
    engine.reset()
    _, _, c = run(engine, longer, mode="plain", max_tokens=5)
    assert c.stats.prompt_evaluated == len(longer)


def test_a_long_prompt_is_read_in_batches_that_report_progress_and_can_be_stopped(engines):
    """A prompt longer than a batch (64 here) is read one batch at a time, each
    reported by an empty chunk: a consumer sees how far reading has got and may
    stop in between (Esc, a client gone) instead of waiting for the whole prompt."""
    engine = engines["same"]
    long_prompt = [1, *(W + (i * 7) % 50 for i in range(199))]
    engine.reset()
    expected, _, _ = run(engine, long_prompt, mode="plain", max_tokens=5)
    engine.reset()
    chunks = engine.generate(long_prompt, GenerationParams(mode="plain", max_tokens=5))
    first = next(chunks)
    assert (first.text, first.tokens, first.stats.prompt_cached, first.stats.prompt_evaluated) == ("", [], 0, 64)
    second = next(chunks)
    assert (second.tokens, second.stats.prompt_evaluated, second.stats.generated_tokens) == ([], 128, 0)
    chunks.close()
    assert first.stats.stop_reason == "cancelled"
    again, _, last = run(engine, long_prompt, mode="plain", max_tokens=5)  # reads on from where it stopped
    assert again == expected
    assert (last.stats.prompt_cached, last.stats.prompt_evaluated) == (128, len(long_prompt) - 128)
    assert all(c.tokens for c in engine.generate(PROMPTS[4], GenerationParams(mode="plain", max_tokens=3)))


def test_max_tokens_and_stop_reasons(engines):
    tokens, _, last = run(engines["same"], PROMPTS[1], mode="draft", k=8, max_tokens=7)
    assert len(tokens) == 7 and last.finish_reason == "max_tokens"
    assert last.stats.stop_reason == "max_tokens"


def test_decode_speed_pays_for_every_cycle(engines, monkeypatch):
    # Decode speed counts from the end of the prompt's pass, not from the first
    # token: the first cycle's time is in it.
    engine = engines["same"]
    slow_cycle = 0.05
    propose = engine.draft_model.propose

    def slow_propose(*args, **kw):
        time.sleep(slow_cycle)
        return propose(*args, **kw)

    monkeypatch.setattr(engine.draft_model, "propose", slow_propose)
    tokens, _, last = run(engine, PROMPTS[1], mode="draft", k=4, max_tokens=5, p_min=0.0)
    stats = last.stats
    assert stats.target_passes == 2 and len(tokens) == 5  # the first token (prompt's pass), one cycle: the draft is the target
    assert stats.decode_s >= slow_cycle  # the drafting cycle is in the decode time
    assert stats.tokens_per_s == pytest.approx(len(tokens) / stats.decode_s)


def test_a_context_smaller_than_the_batch_size_still_takes_long_prompts(synth_target):
    # Asked for 100 positions, llama.cpp lowers n_batch (512) to 100 and rounds
    # the context up to 256: a 150-token prompt must go in batches it accepts
    # (it used to abort the whole process in a GGML_ASSERT).
    with Engine.load(ModelSettings(synth_target, n_ctx=100, n_threads=1)) as engine:
        prompt = [1] + [W + i % 50 for i in range(149)]
        tokens, _, last = run(engine, prompt, mode="plain", max_tokens=3)
        assert len(tokens) == 3 and last.stats.prompt_evaluated == len(prompt)


def test_stop_string_ends_generation_and_is_not_shown(engines):
    engine = engines["same"]
    tokens, _, _ = run(engine, PROMPTS[2], mode="plain", max_tokens=20)
    text = engine.detokenize(tokens)
    stop = text[10:14]
    shown = "".join(c.text for c in engine.generate(PROMPTS[2], GenerationParams(mode="lookup", max_tokens=20, stop=(stop,))))
    assert shown == text[: text.index(stop)]


def test_full_context_stops_with_reason_context(synth_target):
    with Engine.load(settings(synth_target, n_ctx=32), settings(synth_target, n_ctx=32)) as engine:
        n_ctx = engine.n_ctx  # llama.cpp may round the size up
        tokens, _, last = run(engine, PROMPTS[2], mode="draft", k=8, max_tokens=10 * n_ctx)
        assert last.finish_reason == "context"
        assert len(PROMPTS[2]) + len(tokens) == n_ctx
        with pytest.raises(ContextFullError, match=f"context holds {n_ctx}"):
            run(engine, [1] * (n_ctx + 5), mode="plain")


def test_sampling_is_seedable(engines):
    a, _, _ = run(engines["near"], PROMPTS[2], mode="draft", temperature=0.9, seed=7, max_tokens=30)
    b, _, _ = run(engines["near"], PROMPTS[2], mode="draft", temperature=0.9, seed=7, max_tokens=30)
    c, _, _ = run(engines["near"], PROMPTS[2], mode="draft", temperature=0.9, seed=8, max_tokens=30)
    assert a == b and a != c


def test_text_streams_whole_utf8_characters(engines):
    engine = engines["same"]
    euro = [3 + b for b in "€".encode()]  # three byte tokens
    assert engine.tokenize("€")[-3:] == euro
    piece = engine.target_model.token_to_piece
    detok = Detokenizer(lambda t: piece(t, special=False))
    assert [detok.add([t]) for t in euro] == ["", "", "€"]
    assert engine.detokenize(euro) == "€"


def test_incompatible_draft_is_refused_with_the_difference(synth_target, synth_other_vocab):
    with pytest.raises(IncompatibleDraftError, match=r"draft vocab has 659 tokens, target 317"):
        Engine.load(settings(synth_target), settings(synth_other_vocab))


def test_missing_and_non_gguf_files_get_clear_errors(tmp_path, synth_target):
    with pytest.raises(ModelFileError, match="model file not found"):
        Engine.load(settings(tmp_path / "nope.gguf"))
    bogus = tmp_path / "bogus.gguf"
    bogus.write_bytes(b"<html>not a model</html>")
    with pytest.raises(ModelFileError, match="not a GGUF model file"):
        Engine.load(settings(synth_target), settings(bogus))


def test_draft_mode_without_a_draft_model_is_explained(synth_target):
    with Engine.load(settings(synth_target)) as engine:
        with pytest.raises(ValueError, match="needs a draft model"):
            run(engine, PROMPTS[0], mode="draft")


@pytest.mark.parametrize(("pair", "mode"), [("same", "draft"), ("near", "lookup"), ("near", "auto")])
def test_accepted_tokens_are_credited_to_their_sources_and_sum_to_accepted(engines, pair, mode):
    from edgespec.engine.regions import Region

    prompt = PROMPTS[3]  # a repeated pair: lookup matches it in the prompt, then in the reply
    regions = [Region(1, len(prompt), "user:1")]
    _, _, last = run_with_regions(engines[pair], prompt, regions, mode=mode, k=4, max_tokens=40)
    stats = last.stats
    assert sum(stats.accepted_by.values()) == stats.accepted
    assert stats.accepted > 0 or mode == "auto"  # auto may find drafting too dear on a busy machine
    allowed = {"draft": {"draft"}, "lookup": {"lookup/user:1", "lookup/reply"},
               "auto": {"draft", "lookup/user:1", "lookup/reply"}}[mode]
    assert set(stats.accepted_by) <= allowed, stats.accepted_by


def run_with_regions(engine, prompt, regions, **kw):
    tokens, flags, last = [], [], None
    for chunk in engine.generate(prompt, GenerationParams(**kw), regions=regions):
        tokens += chunk.tokens
        flags += chunk.from_draft
        last = chunk
    return tokens, flags, last


def test_max_tokens_none_decodes_until_the_context_is_full(engines):
    """None is "until the context is full" (the server's default): the engine owns that rule."""
    engine = engines["same"]
    for mode in ("plain", "draft"):
        tokens, _, last = run(engine, PROMPTS[2], mode=mode, k=4, max_tokens=None)
        assert last.stats.stop_reason == "context" and len(PROMPTS[2]) + len(tokens) == engine.n_ctx, mode
        assert last.stats.target_passes <= len(tokens) + 1

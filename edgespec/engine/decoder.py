"""The decode loop, as two stacked generators.

`speculative_steps` works on tokens: draft, verify in one target pass, accept,
truncate. `generate` turns steps into text chunks with statistics. Plain
decoding is the same loop with no drafter, so callers never branch on mode.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Callable, Iterator, Sequence

import numpy as np

from edgespec.engine.cache import KVSequence, common_prefix_length
from edgespec.engine.policy import CycleReport, Plan, Policy
from edgespec.engine.detok import Detokenizer, StopStrings
from edgespec.engine.drafters import Draft
from edgespec.engine.events import Chunk, GenerationParams, Stats
from edgespec.engine.sampling import check_params, distribution
from edgespec.engine.verify import accept_greedy, accept_sampled
from edgespec.errors import ContextFullError


@dataclass
class Step:
    """The tokens one cycle added."""

    tokens: list[int]
    from_draft: list[bool]
    plan: Plan
    drafted: int = 0
    accepted: int = 0
    """Draft tokens the target agreed with (an end-of-generation token among them is not emitted)."""
    finish_reason: str | None = None


def speculative_steps(
    target: KVSequence,
    history: list[int],
    params: GenerationParams,
    policy: Policy,
    is_eog: Callable[[int], bool],
    rng: np.random.Generator,
) -> Iterator[Step]:
    """Extend `history` one cycle at a time. The target's cache holds all of
    history but its last token, which goes in at the head of the next pass."""
    if target.tokens != history[:-1]:
        raise RuntimeError("the target cache must hold the history but its last token")
    produced = 0
    while True:
        room = target.room - 1  # free positions once the last token is in
        if room < 1:
            yield Step([], [], Plan(None, 0), finish_reason="context")
            return
        # The first token is decoded alone: its pass reads the prompt's last
        # token, and drafts verified with it would delay the first token that
        # the user waits for (llama.cpp's loops draft from the second on).
        plan = policy.plan(history) if produced else first_token_plan()
        k = min(plan.k, room - 1, params.max_tokens - produced - 1)

        t0 = time.perf_counter()
        draft = _propose(plan, history, k, params, rng)
        t1 = time.perf_counter()
        target.extend([history[-1], *draft.tokens], all_logits=True)
        rows = [target.logits(i) for i in range(len(draft.tokens) + 1)]
        if params.temperature == 0:
            n, token = accept_greedy(draft.tokens, rows)
        else:
            n, token = accept_sampled(draft.tokens, draft.probs, [distribution(r, params) for r in rows], rng)
        target.truncate(len(history) + n)  # drop the rejected drafts from the target's cache
        t2 = time.perf_counter()

        new = [*draft.tokens[:n], token]
        finish = None
        eog = next((i for i, t in enumerate(new) if is_eog(t)), None)
        if eog is not None:
            new, finish = new[:eog], "eog"
        history.extend(new)
        produced += len(new)
        if finish is None and produced >= params.max_tokens:
            finish = "max_tokens"
        if plan.drafter is not None:
            plan.drafter.rewind(history)  # and from the drafter's
        policy.observe(CycleReport(plan, drafted=len(draft.tokens), accepted=n, draft_s=t1 - t0, verify_s=t2 - t1,
                                   caught_up=draft.caught_up, catch_up_s=draft.catch_up_s, asked=max(k, 0)))
        yield Step(new, [True] * min(n, len(new)) + [False] * (len(new) - n), plan,
                   len(draft.tokens), n, finish)
        if finish:
            return


def first_token_plan() -> Plan:
    return Plan(None, 0, "plain: the first token is decoded alone")


def _propose(plan: Plan, history, k, params, rng) -> Draft:
    if plan.drafter is None or k <= 0:
        return Draft([])
    if plan.proposal is not None:
        return Draft(plan.proposal[:k])
    if plan.p_draft is not None:
        params = replace(params, p_draft=plan.p_draft)
    try:
        return plan.drafter.propose(history, k, params, rng)
    except ContextFullError:  # the draft's own context is full: go on without it
        return Draft([])


def generate(
    target: KVSequence,
    prompt: Sequence[int],
    params: GenerationParams,
    policy: Policy,
    *,
    is_eog: Callable[[int], bool],
    piece: Callable[[int], bytes],
) -> Iterator[Chunk]:
    """Stream a completion of `prompt` as text chunks, one per cycle."""
    check_params(params)
    if not prompt:
        raise ValueError("the prompt is empty: at least one token (e.g. BOS) is needed")
    if len(prompt) >= target.n_ctx:
        raise ContextFullError(
            f"the prompt has {len(prompt)} tokens but the context holds {target.n_ctx}: "
            "shorten it or raise the context size"
        )
    stats = Stats(mode=params.mode, prompt_tokens=len(prompt))
    detok = Detokenizer(piece)
    stops = StopStrings(params.stop)
    rng = np.random.default_rng(params.seed)
    start = time.perf_counter()
    context = prompt[:-1]  # the last prompt token is read by the first cycle
    stats.prompt_cached = common_prefix_length(target.tokens, context)
    steps = None
    try:
        for held in target.sync_steps(context):
            stats.prompt_evaluated = held - stats.prompt_cached
            if held < len(context):
                yield Chunk("", stats=stats)  # a long prompt: how far reading has got; the consumer may stop here
        stats.prompt_evaluated += 1
        policy.prefill(prompt)
        decode_start = time.perf_counter()
        steps = speculative_steps(target, list(prompt), params, policy, is_eog, rng)
        for step in steps:
            now = time.perf_counter()
            if stats.ttft_s is None and step.tokens:
                stats.ttft_s = now - start
            stats.decode_s = now - decode_start
            stats.generated_tokens += len(step.tokens)
            stats.target_passes += 1
            stats.drafted += step.drafted
            stats.accepted += step.accepted
            stats.k, stats.drafter, stats.reason = step.plan.k, step.plan.name, step.plan.reason
            stats.plan_kind = step.plan.kind
            text, stopped = stops.feed(detok.add(step.tokens))
            finish = "stop" if stopped else step.finish_reason
            if finish:
                if not stopped:
                    text += stops.feed(detok.flush())[0] + stops.flush()
                stats.stop_reason = finish
                yield Chunk(text, step.tokens, step.from_draft, stats, finish)
                return
            yield Chunk(text, step.tokens, step.from_draft, stats)
    finally:
        if steps is not None:
            steps.close()
        if stats.stop_reason is None:
            stats.stop_reason = "cancelled"

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
    source: str = ""
    """Where the draft came from (Draft.source, or the drafter's name)."""


def speculative_steps(
    target: KVSequence,
    history: list[int],
    params: GenerationParams,
    policy: Policy,
    is_eog: Callable[[int], bool],
    rng: np.random.Generator,
    *,
    clock: Callable[[], float] = time.perf_counter,
) -> Iterator[Step]:
    """Extend `history` one cycle at a time.

    The target's cache holds all of history, and the last decode left the
    logits of its last token: the first token is chosen from those, the
    prompt's own pass (as llama.cpp's loops do: a pass of its own, or drafts
    verified with it, would delay the first token). Only then do the drafters
    read the prompt (Policy.prefill), so that the first token does not wait for
    them either. From then on the cache holds all of history but its last
    token, which goes in at the head of the next pass. `clock` times drafting
    and verifying for the policy (engine/replay.py passes a simulated one)."""
    if target.tokens != history:
        raise RuntimeError("the target cache must hold the history, its last token's logits at hand")
    _, token = _choose(Draft([]), [target.logits(-1)], params, rng)
    new, finish = _ended([token], 0, params, is_eog)
    history.extend(new)
    produced = len(new)
    yield Step(new, [False] * len(new), Plan(None, 0, "plain: the first token comes from the prompt's pass"),
               finish_reason=finish)
    if not finish:
        policy.prefill(history[:-1])
    while not finish:
        room = target.room - 1  # free positions once the last token is in
        if room < 1:
            yield Step([], [], Plan(None, 0), finish_reason="context")
            return
        plan = policy.plan(history)
        k = min(plan.k, room - 1, params.max_tokens - produced - 1)

        t0 = clock()
        draft = _propose(plan, history, k, params, rng)
        t1 = clock()
        target.extend([history[-1], *draft.tokens], all_logits=True)
        n, token = _choose(draft, [target.logits(i) for i in range(len(draft.tokens) + 1)], params, rng)
        target.truncate(len(history) + n)  # drop the rejected drafts from the target's cache
        t2 = clock()

        new, finish = _ended([*draft.tokens[:n], token], produced, params, is_eog)
        history.extend(new)
        produced += len(new)
        if plan.drafter is not None:
            plan.drafter.rewind(history)  # and from the drafter's
        policy.observe(CycleReport(plan, drafted=len(draft.tokens), accepted=n, draft_s=t1 - t0, verify_s=t2 - t1,
                                   caught_up=draft.caught_up, catch_up_s=draft.catch_up_s, asked=max(k, 0)))
        yield Step(new, [True] * min(n, len(new)) + [False] * (len(new) - n), plan,
                   len(draft.tokens), n, finish, draft.source or plan.name)


def _choose(draft: Draft, rows: list[np.ndarray], params: GenerationParams,
            rng: np.random.Generator) -> tuple[int, int]:
    """How many draft tokens the target keeps, and its own next token (`rows`:
    its logits at each draft position and the one after)."""
    if params.temperature == 0:
        return accept_greedy(draft.tokens, rows)
    return accept_sampled(draft.tokens, draft.probs, [distribution(r, params) for r in rows], rng)


def _ended(new: list[int], produced: int, params: GenerationParams,
           is_eog: Callable[[int], bool]) -> tuple[list[int], str | None]:
    """The tokens a cycle adds (none from an end-of-generation token on), and why
    the reply ends there, if it does."""
    eog = next((i for i, t in enumerate(new) if is_eog(t)), None)
    if eog is not None:
        return new[:eog], "eog"
    return new, "max_tokens" if produced + len(new) >= params.max_tokens else None


def _propose(plan: Plan, history, k, params, rng) -> Draft:
    if plan.drafter is None or k <= 0:
        return Draft([])
    if plan.proposal is not None:
        return Draft(plan.proposal[:k], source=plan.source)
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
    last_alone: bool = False,
) -> Iterator[Chunk]:
    """Stream a completion of `prompt` as text chunks, one per cycle. `last_alone`:
    read the prompt's last token in a pass of its own, as it is read again when
    the rest is cached (exact kernels: the same prompt gives the same reply)."""
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
    restored = target.recall(prompt)
    # The prompt's last token is always read, even when cached: its logits give the first token.
    stats.prompt_cached = min(common_prefix_length(target.tokens, prompt), len(prompt) - 1)
    stats.prompt_cache = restored or ("sequence" if stats.prompt_cached else "")
    target.truncate(stats.prompt_cached)
    steps = None
    try:
        reading = prompt[:-1] if last_alone else prompt
        for held in target.sync_steps(reading):
            stats.prompt_evaluated = held - stats.prompt_cached
            if held < len(reading):
                yield Chunk("", stats=stats)  # a long prompt: how far reading has got; the consumer may stop here
        if last_alone:
            target.extend(prompt[-1:])
            stats.prompt_evaluated += 1
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
            if step.accepted:
                stats.accepted_by[step.source] = stats.accepted_by.get(step.source, 0) + step.accepted
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

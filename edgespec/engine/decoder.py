"""The decode loop, as two stacked generators.

`speculative_steps` works on tokens, one `cycle` at a time: draft, verify in one
target pass, accept, truncate both caches. `generate` turns steps into text
chunks with statistics (Stats.record). Plain decoding is the same loop with no
drafter, so callers never branch on mode.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, replace
from typing import Callable, Iterator, Sequence

import numpy as np

from edgespec.engine.cache import KVSequence, common_prefix_length
from edgespec.engine.policy import CycleReport, Plan, Policy
from edgespec.engine.detok import Detokenizer, StopStrings
from edgespec.engine.drafters import Draft, Drafter
from edgespec.engine.events import Chunk, GenerationParams, Stats
from edgespec.engine.sampling import check_params, distribution
from edgespec.engine.verify import accept_greedy, accept_sampled
from edgespec.errors import ContextFullError


@dataclass(slots=True)
class Cycle:
    """What one cycle did: the draft, how much of it the target accepted, its own
    token after that, and the time each half took."""

    plan: Plan
    draft: Draft
    accepted: int
    """Draft tokens the target agreed with."""
    token: int | None
    """The target's own token after them (a correction, or a bonus after a whole
    draft); None where no pass ran (the context is full)."""
    draft_s: float = 0.0
    verify_s: float = 0.0
    """The target's pass and the acceptance (the caches' truncation is not timed, as
    costs.measure_pass does not time it)."""

    @property
    def source(self) -> str:
        """Where the draft came from (Draft.source, else the drafter's name): what Stats.accepted_by credits."""
        return self.draft.source or self.plan.name

    @property
    def tokens(self) -> list[int]:
        """What the cycle adds to the history: the accepted drafts and the target's token."""
        return [*self.draft.tokens[: self.accepted], self.token]


@dataclass(slots=True)
class Step:
    """What one cycle added to the reply (speculative_steps yields one per cycle)."""

    tokens: list[int]
    """The cycle's tokens, none from an end-of-generation token on."""
    from_draft: list[bool]
    cycle: Cycle
    finish_reason: str | None = None

    # What Stats.record reads (events.StepFacts):
    @property
    def drafted(self) -> int:
        return len(self.cycle.draft.tokens)

    @property
    def accepted(self) -> int:
        """Draft tokens the target agreed with (an end-of-generation token among them is not emitted)."""
        return self.cycle.accepted

    @property
    def source(self) -> str:
        return self.cycle.source

    @property
    def plan(self) -> Plan:
        return self.cycle.plan

    @property
    def passes(self) -> int:
        """Target passes the step took: one, none where the context was full."""
        return int(self.cycle.token is not None)


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
    limit = reply_limit(params)
    first = Plan(None, 0, "plain: the first token comes from the prompt's pass")
    _, token = _choose(Draft([]), [target.logits(-1)], params, rng)
    step = _step(Cycle(first, Draft([]), 0, token), 0, limit, is_eog)
    history.extend(step.tokens)
    produced = len(step.tokens)
    yield step
    if not step.finish_reason:
        policy.prefill(history[:-1])
    while not step.finish_reason:
        room = target.room - 1  # free positions once the last token is in
        if room < 1:
            yield Step([], [], Cycle(Plan(None, 0), Draft([]), 0, None), finish_reason="context")
            return
        plan = policy.plan(history)
        k = min(plan.k, room - 1, limit - produced - 1)
        done = cycle(target, history, plan, k, params, rng, clock)
        step = _step(done, produced, limit, is_eog)
        history.extend(step.tokens)
        produced += len(step.tokens)
        policy.observe(CycleReport(plan, drafted=len(done.draft.tokens), accepted=done.accepted,
                                   draft_s=done.draft_s, verify_s=done.verify_s, caught_up=done.draft.caught_up,
                                   catch_up_s=done.draft.catch_up_s, asked=max(k, 0)))
        yield step


def cycle(target: KVSequence, history: list[int], plan: Plan, k: int, params: GenerationParams,
          rng: np.random.Generator, clock: Callable[[], float] = time.perf_counter) -> Cycle:
    """One cycle: draft up to k tokens, verify them in one target pass over
    [last token, drafts], accept up to the first rejection plus the target's own
    token, and leave both caches holding what was accepted."""
    t0 = clock()
    draft = _propose(plan, history, k, params, rng)
    t1 = clock()
    target.extend([history[-1], *draft.tokens], all_logits=True)
    n, token = _choose(draft, [target.logits(i) for i in range(len(draft.tokens) + 1)], params, rng)
    t2 = clock()
    done = Cycle(plan, draft, n, token, draft_s=t1 - t0, verify_s=t2 - t1)
    _rewind(target, plan.drafter, history, done.tokens)
    return done


def _rewind(target: KVSequence, drafter: Drafter | None, history: list[int], added: list[int]) -> None:
    """Both caches back to what was accepted, `history` and the cycle's `added` tokens:
    the target's holds all of it but the last token (read at the head of the next
    pass), and the drafter drops its rejected guesses."""
    target.truncate(len(history) + len(added) - 1)
    if drafter is not None:
        drafter.rewind([*history, *added])


def reply_limit(params: GenerationParams) -> int:
    """The most tokens a reply may have: params.max_tokens, or for None ("until the
    context is full") no limit of its own, so that the full context ends it."""
    return params.max_tokens if params.max_tokens is not None else sys.maxsize


def _step(done: Cycle, produced: int, limit: int, is_eog: Callable[[int], bool]) -> Step:
    """The cycle's tokens as the reply takes them (none from an end-of-generation
    token on), and why the reply ends there, if it does."""
    new = done.tokens
    eog = next((i for i, t in enumerate(new) if is_eog(t)), None)
    if eog is not None:
        new, finish = new[:eog], "eog"
    else:
        finish = "max_tokens" if produced + len(new) >= limit else None
    n = min(done.accepted, len(new))
    return Step(new, [True] * n + [False] * (len(new) - n), done, finish)


def _choose(draft: Draft, rows: list[np.ndarray], params: GenerationParams,
            rng: np.random.Generator) -> tuple[int, int]:
    """How many draft tokens the target keeps, and its own next token (`rows`:
    its logits at each draft position and the one after)."""
    if params.temperature == 0:
        return accept_greedy(draft.tokens, rows)
    return accept_sampled(draft.tokens, draft.probs, [distribution(r, params) for r in rows], rng)


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
            text, stopped, step = _shown(step, detok, stops)
            now = time.perf_counter()
            stats.record(step, since_call=now - start, since_decode=now - decode_start)
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


def _shown(step: Step, detok: Detokenizer, stops: StopStrings) -> tuple[str, bool, Step]:
    """The step's new text, whether a stop string ended it, and the step as the reply
    takes it. With stop strings its tokens are read one at a time, as plain decoding
    reads them: the reply ends with the token that completes the first stop string
    (of several, the one completed first), and the rest of the cycle is not part of it."""
    if not stops.stops:
        return detok.add(step.tokens), False, step
    text = ""
    for i, token in enumerate(step.tokens):
        shown, stopped = stops.feed(detok.add([token]))
        text += shown
        if stopped:
            return text, True, replace(step, tokens=step.tokens[: i + 1], from_draft=step.from_draft[: i + 1])
    return text, False, step

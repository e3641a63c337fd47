"""What the engine yields: the one event stream the CLI, the chat app and the
benchmark all consume.

`generate()` (engine/decoder.py) yields `Chunk`s, one per decode cycle; the
last one has `finish_reason` set. `Chunk.stats` is the same live `Stats`
object throughout a generation, so a consumer may keep a reference to it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Mapping, Protocol

from edgespec.limits import LIMITS
from edgespec.modes import DEFAULT_MODE
from edgespec.modes import MODES as MODES  # re-exported: GenerationParams.mode is one of them


@dataclass
class GenerationParams:
    """How to generate. Temperature 0 means greedy (argmax). The ranges and defaults
    of k, temperature, top_k, top_p, seed and max_tokens are in edgespec/limits.py."""

    mode: str = DEFAULT_MODE
    k: int = LIMITS["k"].default
    """Most tokens drafted per cycle, by any drafter, within the largest batch the
    target verifies exactly. Auto chooses up to k for every drafter."""
    temperature: float = LIMITS["temperature"].default
    top_k: int = LIMITS["top_k"].default
    """0 disables top-k."""
    top_p: float = LIMITS["top_p"].default
    """1.0 disables top-p."""
    seed: int | None = LIMITS["seed"].default
    max_tokens: int | None = LIMITS["max_tokens"].default
    """None: until the context is full (the server's default, limits.SERVER_MAX_TOKENS)."""
    stop: tuple[str, ...] = ()
    p_min: float = 0.3
    """The draft model stops drafting when its top probability falls below this
    (as llama.cpp's p_min)."""
    p_draft: float | None = None
    """It also stops when the chance that its whole draft is right (the product of
    its top probabilities) falls below this: a guess after an unsure one is
    likely wasted. Auto mode sets it each cycle from the measured costs (see
    Costs.break_even); None: p_min alone."""


class _PlanFacts(Protocol):
    @property
    def k(self) -> int: ...
    @property
    def name(self) -> str: ...
    @property
    def reason(self) -> str: ...
    @property
    def kind(self) -> str: ...


class StepFacts(Protocol):
    """What Stats.record reads of one decode cycle (decoder.Step, which this module cannot import)."""

    @property
    def tokens(self) -> list[int]: ...
    @property
    def passes(self) -> int: ...
    @property
    def drafted(self) -> int: ...
    @property
    def accepted(self) -> int: ...
    @property
    def source(self) -> str: ...
    @property
    def plan(self) -> _PlanFacts: ...


@dataclass
class Stats:
    """Statistics of one generation, updated live while it runs."""

    mode: str = "plain"
    prompt_tokens: int = 0
    """Tokens in the prompt (the whole conversation for a chat)."""
    prompt_evaluated: int = 0
    """Prompt tokens the target actually evaluated (so far, while it reads the prompt)."""
    prompt_cached: int = 0
    """Prompt tokens its KV cache already held (reused, not evaluated)."""
    prompt_cache: str = ""
    """Where those came from: "sequence" (held in the KV cache), "ram" or "disk" (a
    snapshot of the conversation, restored), or "" (none)."""
    generated_tokens: int = 0
    drafted: int = 0
    accepted: int = 0
    accepted_by: dict[str, int] = field(default_factory=dict)
    """Accepted draft tokens per source, summing to `accepted`: "draft" (the draft
    model), "lookup/<label>" (prompt lookup, by the prompt region its match lay in:
    "lookup/system", "lookup/user:3", "lookup/file:<path>", "lookup/prompt" outside
    every region, "lookup/reply" in the reply itself), or another drafter's name."""
    target_passes: int = 0
    ttft_s: float | None = None
    """Seconds from the call to the first generated token (includes prompt evaluation)."""
    decode_s: float = 0.0
    """Seconds from the end of prompt evaluation to the latest token. The first
    cycle evaluates the prompt's last token along with the first drafts, as
    llama.cpp's own loops do, so every generated token is paid for in here."""
    k: int = 0
    """Draft length of the latest cycle."""
    drafter: str = "none"
    """Drafter of the latest cycle: "none", "draft" or "lookup"."""
    reason: str = ""
    """Why the latest cycle's drafter and k were chosen (auto mode)."""
    plan_kind: str = "plain"
    """The latest cycle's kind of plan: "plain", "chosen" (the best expected rate) or
    "probe" (auto mode checking a drafter it stopped using)."""
    stop_reason: str | None = None
    """Why it ended: "eog" (end-of-generation token), "max_tokens", "stop" (a stop
    string), "context" (the context window is full) or "cancelled" (the consumer
    stopped it)."""
    dropped_messages: int = 0
    """Oldest messages left out so that a chat fits in the context (chat sessions)."""

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def tokens_per_pass(self) -> float:
        return self.generated_tokens / self.target_passes if self.target_passes else 0.0

    @property
    def tokens_per_s(self) -> float:
        """Decode speed: generated tokens over decode time. (Counting from the
        first token instead would give a speculative first cycle's extra tokens
        for free and flatter speculation.)"""
        n = self.generated_tokens
        return n / self.decode_s if n > 0 and self.decode_s > 0 else 0.0

    def record(self, step: StepFacts, *, since_call: float, since_decode: float) -> None:
        """Add one decode cycle (decoder.Step): its tokens, its pass, its draft and how
        much of it was accepted, from where, and the plan it followed; `since_call`,
        `since_decode`: seconds from the call and from the end of the prompt's reading."""
        if self.ttft_s is None and step.tokens:
            self.ttft_s = since_call
        self.decode_s = since_decode
        self.generated_tokens += len(step.tokens)
        self.target_passes += step.passes
        self.drafted += step.drafted
        self.accepted += step.accepted
        if step.accepted:
            self.accepted_by[step.source] = self.accepted_by.get(step.source, 0) + step.accepted
        plan = step.plan
        self.k, self.drafter, self.reason, self.plan_kind = plan.k, plan.name, plan.reason, plan.kind

    def to_dict(self) -> dict:
        """The stored, exported and served form: every field, and the derived rates."""
        d = asdict(self)
        d.update(
            acceptance_rate=self.acceptance_rate,
            tokens_per_pass=self.tokens_per_pass,
            tokens_per_s=self.tokens_per_s,
        )
        return d

    @classmethod
    def from_dict(cls, d: Mapping) -> Stats:
        """to_dict()'s output read back (a stored reply, an export, a served reply), of
        this version or an earlier one: a field it lacks keeps its default, and the
        derived rates are computed again."""
        stats = cls(**{name: d[name] for name in _FIELDS if name in d})
        stats.accepted_by = dict(stats.accepted_by or {})
        return stats


_FIELDS = tuple(f.name for f in fields(Stats))


@dataclass
class Chunk:
    """The output of one decode cycle."""

    text: str
    """New text, UTF-8 safe (an incomplete character waits for the next chunk)."""
    tokens: list[int] = field(default_factory=list)
    from_draft: list[bool] = field(default_factory=list)
    """Per token: True when it was a draft token the target accepted."""
    stats: Stats = field(default_factory=Stats)
    finish_reason: str | None = None


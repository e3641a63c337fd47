"""What a policy decides before each cycle (`Plan`), what it learns from after
(`CycleReport`), and the policies of the fixed modes. Auto mode's policy is in
engine/auto.py; what things cost is measured in engine/costs.py.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Callable, Sequence

from edgespec.engine.drafters import Drafter

@dataclass(frozen=True)
class Bucket:
    """Whose acceptance a cycle measures (auto mode): a drafter, and for prompt
    lookup the kind of match it made (see PromptLookup.match), which predicts
    how often its proposal is right."""

    drafter: str
    match: str | None = None

    def __str__(self) -> str:
        return self.drafter if self.match is None else f"{self.drafter}/{self.match}"


@dataclass
class Plan:
    drafter: Drafter | None
    k: int
    reason: str = ""
    """Why, for people (built from the other fields)."""
    bucket: Bucket | None = None
    """Whose acceptance this cycle measures (auto mode)."""
    proposal: list[int] | None = None
    """The draft, when the policy already made it to choose k (prompt lookup in auto mode)."""
    source: str = ""
    """Where that proposal came from (Offer.source)."""
    p_draft: float | None = None
    """The least chance that a draft model's whole draft is right for it to go on
    drafting (GenerationParams.p_draft). Auto mode derives it from the measured costs."""
    kind: str = "chosen"
    """Why the cycle drafts what it drafts: "plain" (not at all, whenever there is
    no drafter), "chosen" (the best expected rate) or "probe" (to learn whether a
    drafter's acceptance has changed: auto mode's exploration)."""
    speedup: float | None = None
    """Expected tokens per second over plain decoding's (auto mode)."""
    acceptance: float | None = None
    """The bucket's acceptance rate when the plan was made (auto mode)."""
    declined: Plan | None = None
    """For auto mode's plain plans: the best drafting plan, which it did not take
    (None: nothing to draft). Below the margin it would not pay; above it, it
    would risk more than the reply's ledger allows."""

    def __post_init__(self):
        if self.drafter is None or self.k <= 0:
            self.kind = "plain"

    @property
    def name(self) -> str:
        return self.drafter.name if self.drafter and self.k > 0 else "none"


@dataclass
class CycleReport:
    """What happened in one cycle, for policies that learn."""

    plan: Plan
    drafted: int
    accepted: int
    draft_s: float
    verify_s: float
    caught_up: int = 0
    """Tokens the drafter evaluated before drafting (see Draft.caught_up)."""
    catch_up_s: float = 0.0
    asked: int | None = None
    """The draft length the cycle asked for: the plan's k, cut to the room left
    (None: the plan's k). A drafter that drafted fewer stopped itself."""

    def __post_init__(self):
        if self.asked is None:
            self.asked = self.plan.k if self.plan.drafter is not None else 0

    @property
    def stopped(self) -> bool:
        """The drafter gave fewer tokens than asked for (a draft model unsure of its next guess)."""
        return self.drafted < self.asked


class Policy(ABC):
    @abstractmethod
    def plan(self, history: Sequence[int]) -> Plan:
        """The drafter and draft length for the next cycle."""

    def observe(self, report: CycleReport) -> None:
        """Learn from a finished cycle (fixed policies ignore it)."""

    def prefill(self, prompt: Sequence[int]) -> None:
        """Let the drafters this policy expects to use read the prompt now,
        once the first token is out (llama.cpp's loops do it with the prompt,
        which delays the first token by the reading)."""

    def read_ahead(self, prompt: Sequence[int]) -> None:
        """Let the drafters this policy may use read the start of a prompt not sent
        yet (the chat reads the conversation, attached files and the words written
        so far while the user writes: Engine.read): what they read then, the reply
        need not read. Nothing to wait for, nothing learnt: not a reply."""


class Deferred(Policy):
    """A policy made only once the first token is out (at its prefill), so that what
    making it measures (auto mode's calibration) does not delay the first token."""

    def __init__(self, make: Callable[[], Policy]):
        self._make = make
        self._policy: Policy | None = None

    def prefill(self, prompt):
        self._policy = self._make()
        self._policy.prefill(prompt)

    def read_ahead(self, prompt):
        # Made now, while the user writes: its calibration then delays no reply at all.
        self._policy = self._policy or self._make()
        self._policy.read_ahead(prompt)

    def plan(self, history):
        return self._policy.plan(history)  # the decoder always prefills first

    def observe(self, report):
        self._policy.observe(report)


class FixedPolicy(Policy):
    """Always the same drafter and k (None or k = 0: plain decoding)."""

    def __init__(self, drafter: Drafter | None, k: int, reason: str = "fixed"):
        self._plan = Plan(drafter, k if drafter else 0, reason)

    def plan(self, history):
        return self._plan

    def prefill(self, prompt):
        if self._plan.drafter is not None:
            self._plan.drafter.prefill(prompt)

    def read_ahead(self, prompt):
        self.prefill(prompt)

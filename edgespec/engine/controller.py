"""Policies: before each cycle, which drafter and how many tokens to draft.

`FixedPolicy` serves the plain, draft and lookup modes. `AutoPolicy` (mode
auto) picks the drafter and k that maximise expected tokens per second from
costs measured on this machine and acceptance measured online.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Sequence

from edgespec.engine.drafters import Drafter


@dataclass
class Plan:
    drafter: Drafter | None
    k: int
    reason: str = ""

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


class Policy(ABC):
    @abstractmethod
    def plan(self, history: Sequence[int]) -> Plan:
        """The drafter and draft length for the next cycle."""

    def observe(self, report: CycleReport) -> None:
        """Learn from a finished cycle (fixed policies ignore it)."""


class FixedPolicy(Policy):
    """Always the same drafter and k (None or k = 0: plain decoding)."""

    def __init__(self, drafter: Drafter | None, k: int):
        self._plan = Plan(drafter, k if drafter else 0, "fixed")

    def plan(self, history):
        return self._plan

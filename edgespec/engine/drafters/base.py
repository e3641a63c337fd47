"""The drafter interface: what every drafter gives (Draft) and offers (Offer).

One small interface, so that a new drafter is a new module and tests can swap
in a fake: `propose(history, k, params, rng) -> Draft`, plus `rewind(history)`
called after each cycle with the accepted tokens, `offer(history, k_max)`:
what a policy that prices drafters (auto mode) may expect of it next cycle,
and `start(regions)` at each reply. A draft and an offer name their `source`,
which the decoder credits with the tokens the target accepted of them.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from edgespec.engine.events import GenerationParams
from edgespec.engine.regions import Regions


@dataclass
class Draft:
    tokens: list[int]
    probs: np.ndarray | None = None
    """q: one row per token, the distribution it was drawn from (sampling with a
    draft model); None for a deterministic proposal (greedy, prompt lookup)."""
    caught_up: int = 0
    """Tokens the drafter evaluated to catch up with the history before drafting:
    1 or 2 when it drafted last cycle too, many after it sat idle."""
    catch_up_s: float = 0.0
    """Seconds that catch-up took."""
    source: str = ""
    """Where the tokens came from, for Stats.accepted_by: "lookup/<region label>"
    (see engine/regions.py); "": the drafter itself (its name)."""


@dataclass(frozen=True)
class Offer:
    """What a drafter can give the next cycle, said before it drafts: what auto mode prices."""

    k_max: int
    """The longest draft worth asking it for (0: it has nothing to offer)."""
    key: str | None = None
    """Which of the drafter's acceptance rates predicts this draft (prompt lookup:
    the kind of match it made); None: its one rate."""
    proposal: list[int] | None = None
    """The draft itself, when making it costs nothing (prompt lookup): priced as it
    is, and scored against what the cycle produced when another plan is taken.
    None: drafted on demand, in the cycle (a draft model), so its acceptance is
    only learnt by using it."""
    source: str = ""
    """Where the proposal came from (see Draft.source): the decoder credits the
    tokens accepted of it there."""


class Drafter(ABC):
    name: str

    @abstractmethod
    def propose(self, history: Sequence[int], k: int, params: GenerationParams,
                rng: np.random.Generator) -> Draft:
        """Up to k tokens likely to follow `history` (fewer, or none, is fine)."""

    def rewind(self, history: Sequence[int]) -> None:
        """The cycle is over and `history` is what was accepted: drop the rest."""

    def behind(self, history: Sequence[int]) -> int:
        """Tokens of `history` the drafter would have to read before drafting."""
        return 0

    def start(self, regions: Regions) -> None:
        """A new reply: where its prompt's labelled parts lie (for Draft.source)."""

    def prefill(self, prompt: Sequence[int]) -> None:
        """Read the prompt while the target reads it, so that drafting starts warm."""

    def offer(self, history: Sequence[int], k_max: int) -> Offer:
        """What the drafter can give the cycle after `history`, at most `k_max` tokens."""
        return Offer(k_max)


def too_unsure(sure: float, whole: float, params: GenerationParams) -> bool:
    """Whether a draft model stops before a guess it gives probability `sure`,
    with `whole` the chance that its draft including that guess is right: a
    likely rejection costs a target column."""
    return sure < params.p_min or (params.p_draft is not None and whole < params.p_draft)

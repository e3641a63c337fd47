"""Drafters propose the next few tokens; the target checks them.

base.py holds the interface (Drafter, Draft, Offer); each drafter is a module of
its own: draft_model.py (a second GGUF model), lookup.py (prompt lookup),
pool_lookup.py (earlier text: the drafter that remembers).
"""

from typing import Callable

from edgespec.engine.cache import KVSequence
from edgespec.engine.drafters.base import Draft, Drafter, Offer, too_unsure
from edgespec.engine.drafters.draft_model import DraftModel
from edgespec.engine.drafters.lookup import PromptLookup
from edgespec.engine.drafters.pool_lookup import PoolLookup
from edgespec.engine.suffix import SuffixIndex

__all__ = ["Draft", "Drafter", "DraftModel", "Offer", "PoolLookup", "PromptLookup", "engine_drafters", "too_unsure"]


def engine_drafters(draft: KVSequence | None, *, is_eog: Callable[[int], bool],
                    n_vocab: int, pool: SuffixIndex | None = None) -> list[Drafter]:
    """Every drafter an engine decodes with, built here only: a new drafter is a module
    and a line below. Auto mode weighs them all (of equal rates, the first wins); a mode
    named after a drafter uses that one alone. `draft`: the draft model's sequence, if
    there is a draft model; `is_eog`, `n_vocab`: the draft's end test, the target's size; `pool`:
    the earlier text kept for this tokenizer (engine/pool.py), if the pool is on."""
    return [
        PromptLookup(),
        *([PoolLookup(pool)] if pool is not None else []),
        *([DraftModel(draft, is_eog=is_eog, n_vocab=n_vocab)] if draft is not None else []),
    ]

"""Drafters propose the next few tokens; the target checks them.

base.py holds the interface (Drafter, Draft, Offer); each drafter is a module of
its own: draft_model.py (a second GGUF model), lookup.py (prompt lookup).
"""

from edgespec.engine.drafters.base import Draft, Drafter, Offer, too_unsure
from edgespec.engine.drafters.draft_model import DraftModel
from edgespec.engine.drafters.lookup import PromptLookup

__all__ = ["Draft", "Drafter", "DraftModel", "Offer", "PromptLookup", "too_unsure"]

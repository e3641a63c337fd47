"""The speculation modes, one list for every layer: the engine runs them,
models.yaml's pairs recommend one, the CLI, the app and the server offer them;
and how a reply's mode and k follow from what the user set (`reply_decoding`)."""

from __future__ import annotations

from edgespec.limits import MAX_DRAFT

MODES = ("plain", "draft", "lookup", "auto")
"""No drafter, a draft model, prompt lookup, or chosen per cycle (auto)."""

DEFAULT_MODE = "auto"
"""The mode of a reply that names none, where no pair recommends one (models.yaml)."""

MODE_K = {"plain": 0, "draft": 8, "lookup": 8, "auto": MAX_DRAFT}
"""Each mode's k where neither the user nor a pair recommending that mode sets
one. Auto prices every length up to k and takes a long draft only where the
reply copies, so its k is the longest; a fixed mode drafts up to k every cycle
it can, and on a CPU a rejected 65-token verify pass costs as much as 20 plain
tokens (limits.MAX_DRAFT), so it drafts 8."""


def reply_decoding(mode: str | None, k: int | None, recommended: tuple[str, int]) -> tuple[str, int]:
    """The mode and k a reply decodes with: those given; for what is not given,
    the `recommended` (mode, k) (a pair's in models.yaml, the server's defaults),
    whose k goes only with its own mode: any other mode takes its MODE_K."""
    recommended_mode, recommended_k = recommended
    mode = mode or recommended_mode
    if k is None:
        k = recommended_k if mode == recommended_mode else MODE_K[mode]
    return mode, k

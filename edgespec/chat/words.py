"""How the engine's facts read for people, the same in every face: a reply's
statistics and where a model's layers run. (The engine returns them as data:
Stats, Engine.describe.)"""

from __future__ import annotations

from edgespec.engine.events import Stats
from edgespec.engine.info import EngineInfo


RATE_MIN_S = 0.02
"""A speed is shown over at least this long a decode: over a pass or two it measures the
timer, not the decoding (a one-token reply read "6294.7 tok/s")."""

CACHE_SOURCES = {"sequence": "KV cache", "ram": "RAM snapshot", "disk": "disk snapshot"}
"""Stats.prompt_cache, for people."""

DRAFTERS = {"draft": "draft model", "lookup": "lookup", "pool": "pool"}
"""The drafter part of a Stats.accepted_by source, for people."""

POOL_KINDS = {"conversation": "earlier conversations", "request": "earlier requests", "file": "earlier files"}
"""The kind of document a pool match lay in ("pool/<kind>", chat/remember.py's names), for people."""

REGIONS = {"system": "system prompt", "prompt": "prompt", "reply": "the reply"}
"""Region labels (engine/regions.py, chat/prompt.py) that read differently for people."""


def stats_line(stats: Stats | None) -> str:
    """One line about a reply for people, live or stored: tokens, speed, and how
    speculation did."""
    if stats is None:
        return ""
    parts = [f"{stats.generated_tokens} tokens"]
    if stats.tokens_per_s and _timed(stats):
        parts.append(f"{stats.tokens_per_s:.1f} tok/s")
    if stats.drafted:
        by = f"; {accepted_by_note(stats)}" if stats.accepted_by else ""
        parts.append(f"accepted {stats.accepted}/{stats.drafted} ({stats.acceptance_rate:.0%}{by})")
    if _tokens_per_pass(stats):
        parts.append(f"{_tokens_per_pass(stats):.2f} tok/pass")
    parts.append(stats.mode)
    if stats.prompt_cached:
        parts.append(cache_note(stats))
    if stats.dropped_messages:
        parts.append(f"{stats.dropped_messages} oldest messages left out")
    if stats.stop_reason and stats.stop_reason != "eog":
        parts.append(f"ended: {stats.stop_reason}")
    return " · ".join(parts)


def cache_note(stats: Stats) -> str:
    """How much of the prompt was not read, and from where: 'prompt 1,500/1,531 cached (RAM snapshot)'."""
    where = CACHE_SOURCES.get(stats.prompt_cache, "")
    return f"prompt {stats.prompt_cached:,}/{stats.prompt_tokens:,} cached" + (f" ({where})" if where else "")


def accepted_by_note(stats: Stats) -> str:
    """Where the accepted draft tokens came from, most first: '40 from draft model, 12 from lookup in file app.py'."""
    ranked = sorted(stats.accepted_by.items(), key=lambda item: -item[1])
    return ", ".join(f"{n:,} from {source_words(source)}" for source, n in ranked)


def source_words(source: str) -> str:
    """A Stats.accepted_by source for people: "lookup/file:app.py" -> 'lookup in file app.py',
    "lookup/user:3" -> 'lookup in user message 3', "draft" -> 'draft model',
    "pool/conversation" -> 'earlier conversations'."""
    drafter, _, label = source.partition("/")
    if drafter == "pool" and label:
        return POOL_KINDS.get(label, f"earlier {label}")
    words = DRAFTERS.get(drafter, drafter)
    return f"{words} in {_region_words(label)}" if label else words


def _region_words(label: str) -> str:
    kind, _, rest = label.partition(":")
    if kind == "file" and rest:
        return f"file {rest}"
    if rest.isdigit():
        return f"{kind} message {rest}"
    return REGIONS.get(label, label)


def _timed(stats: Stats) -> bool:
    """Whether the reply's speed was measured over enough tokens and time to mean something."""
    return stats.generated_tokens >= 2 and stats.decode_s >= RATE_MIN_S


def _tokens_per_pass(stats: Stats) -> float:
    """Tokens per target pass, the end-of-generation token counted as one its pass
    produced: a plain reply reads 1.00 whether it ended on EOS or on max_tokens."""
    if not stats.target_passes:
        return 0.0
    return (stats.generated_tokens + (stats.stop_reason == "eog")) / stats.target_passes


def placement_line(info: EngineInfo) -> str:
    """The target's layers for people: 'layers: CPU 12, RPC0@10.0.0.2:50052 19'."""
    return "layers: " + ", ".join(f"{r.device}{'@' + r.worker if r.worker else ''} {r.layers}"
                                  for r in info.target.layers)

"""How the engine's facts read for people, the same in every face: a reply's
statistics and where a model's layers run. (The engine returns them as data:
Stats, Engine.describe.)"""

from __future__ import annotations

from edgespec.engine.events import cache_note
from edgespec.engine.info import EngineInfo


RATE_MIN_S = 0.02
"""A speed is shown over at least this long a decode: over a pass or two it measures the
timer, not the decoding (a one-token reply read "6294.7 tok/s")."""


def stats_line(stats: dict | None) -> str:
    """One line about a reply for people, from `Stats.to_dict()` (live or stored):
    tokens, speed, and how speculation did."""
    if not stats:
        return ""
    parts = [f"{stats.get('generated_tokens', 0)} tokens"]
    if stats.get("tokens_per_s") and _timed(stats):
        parts.append(f"{stats['tokens_per_s']:.1f} tok/s")
    if stats.get("drafted"):
        parts.append(f"accepted {stats.get('accepted', 0)}/{stats['drafted']} ({stats.get('acceptance_rate', 0):.0%})")
    if _tokens_per_pass(stats):
        parts.append(f"{_tokens_per_pass(stats):.2f} tok/pass")
    parts.append(stats.get("mode", "plain"))
    if stats.get("prompt_cached"):
        parts.append(cache_note(stats))
    if stats.get("dropped_messages"):
        parts.append(f"{stats['dropped_messages']} oldest messages left out")
    if stats.get("stop_reason") and stats["stop_reason"] != "eog":
        parts.append(f"ended: {stats['stop_reason']}")
    return " · ".join(parts)


def _timed(stats: dict) -> bool:
    """Whether the reply's speed was measured over enough tokens and time to mean something."""
    decode_s = stats.get("decode_s")
    return stats.get("generated_tokens", 0) >= 2 and (decode_s is None or decode_s >= RATE_MIN_S)


def _tokens_per_pass(stats: dict) -> float:
    """Tokens per target pass, the end-of-generation token counted as one its pass
    produced: a plain reply reads 1.00 whether it ended on EOS or on max_tokens."""
    passes = stats.get("target_passes")
    if not passes:
        return stats.get("tokens_per_pass") or 0.0
    return (stats.get("generated_tokens", 0) + (stats.get("stop_reason") == "eog")) / passes


def placement_line(info: EngineInfo) -> str:
    """The target's layers for people: 'layers: CPU 12, RPC0@10.0.0.2:50052 19'."""
    return "layers: " + ", ".join(f"{r.device}{'@' + r.worker if r.worker else ''} {r.layers}"
                                  for r in info.target.layers)

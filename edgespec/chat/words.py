"""How the engine's facts read for people, the same in every face: a reply's
statistics and where a model's layers run. (The engine returns them as data:
Stats, Engine.describe.)"""

from __future__ import annotations

from edgespec.engine.events import cache_note
from edgespec.engine.info import EngineInfo


def stats_line(stats: dict | None) -> str:
    """One line about a reply for people, from `Stats.to_dict()` (live or stored):
    tokens, speed, and how speculation did."""
    if not stats:
        return ""
    parts = [f"{stats.get('generated_tokens', 0)} tokens"]
    if stats.get("tokens_per_s"):
        parts.append(f"{stats['tokens_per_s']:.1f} tok/s")
    if stats.get("drafted"):
        parts.append(f"accepted {stats.get('accepted', 0)}/{stats['drafted']} ({stats.get('acceptance_rate', 0):.0%})")
    if stats.get("tokens_per_pass"):
        parts.append(f"{stats['tokens_per_pass']:.2f} tok/pass")
    parts.append(stats.get("mode", "plain"))
    if stats.get("prompt_cached"):
        parts.append(cache_note(stats))
    if stats.get("dropped_messages"):
        parts.append(f"{stats['dropped_messages']} oldest messages left out")
    if stats.get("stop_reason") and stats["stop_reason"] != "eog":
        parts.append(f"ended: {stats['stop_reason']}")
    return " · ".join(parts)


def placement_line(info: EngineInfo) -> str:
    """The target's layers for people: 'layers: CPU 12, RPC0@10.0.0.2:50052 19'."""
    return "layers: " + ", ".join(f"{r.device}{'@' + r.worker if r.worker else ''} {r.layers}"
                                  for r in info.target.layers)

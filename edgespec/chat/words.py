"""How the engine's facts read for people, the same in every face: where a model's
layers run. (The engine returns them as data: Engine.describe.)"""

from __future__ import annotations


def placement_line(info: dict) -> str:
    """The target's layers for people: 'layers: CPU 12, RPC0@10.0.0.2:50052 19'."""
    rows = info["models"]["target"].get("layers") or []
    return "layers: " + ", ".join(f"{r['device']}{'@' + r['worker'] if r['worker'] else ''} {r['layers']}"
                                  for r in rows)

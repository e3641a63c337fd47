"""A streaming reply between the decode thread and the screen: the thread adds
chunks to a `ReplyBuffer` and goes on; a `RedrawTimer` drains it at a rate that
keeps the screen's own CPU time within its share (`redraw_share`)."""

from __future__ import annotations

import threading
import time
from typing import Awaitable, Callable

from textual.message_pump import MessagePump

from edgespec.engine.info import EngineInfo

RENDER_HZ = 15
"""The most a streaming reply is redrawn per second (smooth to the eye)."""

RENDER_WAIT_MAX = 2.0
"""The longest wait between redraws, whatever they cost: the reply must be seen to move."""

RENDER_SHARE = 0.02
"""The most of a CPU the screen may spend while a reply streams from a target
that decodes on this machine's CPU. There llama.cpp decodes on every core, so
what the screen draws is taken from decoding, and re-laying out a growing
Markdown reply costs more each time. The screen measures its own CPU time and
waits long enough after each redraw to stay within this share."""


def redraw_share(info: EngineInfo | None) -> float | None:
    """The screen's share of a CPU for replies of the models `info` describes
    (Engine.describe(); None where it could not say): RENDER_SHARE, or None (RENDER_HZ
    alone) when every layer of the target is on a local GPU and the CPU the screen
    uses is not the decode's."""
    if info is None:
        return RENDER_SHARE
    target = info.target
    on_gpu = info.gpu_offload is True and bool(target.n_layer) and target.n_gpu_layers >= target.n_layer + 1
    on_workers = any(row.worker for row in target.layers)
    return None if on_gpu and not on_workers else RENDER_SHARE


def redraw_wait(spent: float, share: float | None) -> float:
    """Seconds until the next redraw after the screen spent `spent` CPU seconds
    since the last: long enough to keep within `share`, within RENDER_HZ and RENDER_WAIT_MAX."""
    if share is None:
        return 1 / RENDER_HZ
    return min(max(1 / RENDER_HZ, spent / share), RENDER_WAIT_MAX)


class ReplyBuffer:
    """Chunks the decode thread has produced and the screen has not drawn yet."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._text: list[str] = []
        self._runs: list[tuple[str, bool]] = []
        self._stats = None

    def add(self, text: str, runs: list[tuple[str, bool]], stats) -> None:
        with self._lock:
            self._text.append(text)
            self._runs.extend(runs)
            self._stats = stats

    def take(self) -> tuple[str, list[tuple[str, bool]], object]:
        """Everything added since the last take: (text, runs, latest stats or None)."""
        with self._lock:
            taken = "".join(self._text), self._runs, self._stats
            self._text, self._runs, self._stats = [], [], None
        return taken


class RedrawTimer:
    """Calls `redraw` while a reply streams: at most RENDER_HZ times a second,
    and after each call waits until the screen's CPU time since the previous
    one is at most RENDER_SHARE of the time that passed, or RENDER_WAIT_MAX
    (Textual draws on the app's thread, so that thread's CPU time is what the
    screen costs)."""

    def __init__(self, node: MessagePump, redraw: Callable[[], Awaitable[None]],
                 share: float | None = RENDER_SHARE) -> None:
        self._node, self._redraw, self._share = node, redraw, share
        self._cpu = time.thread_time()
        self._timer = node.set_timer(1 / RENDER_HZ, self._tick)

    async def _tick(self) -> None:
        await self._redraw()
        cpu = time.thread_time()
        spent, self._cpu = cpu - self._cpu, cpu
        self._timer = self._node.set_timer(redraw_wait(spent, self._share), self._tick)

    def stop(self) -> None:
        self._timer.stop()

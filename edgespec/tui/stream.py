"""A streaming reply between the decode thread and the screen: the thread adds
chunks to a `ReplyBuffer` and goes on; a `RedrawTimer` drains it at a rate that
keeps the screen's own CPU time within RENDER_SHARE."""

from __future__ import annotations

import threading
import time
from typing import Awaitable, Callable

from textual.message_pump import MessagePump

RENDER_HZ = 15
"""The most a streaming reply is redrawn per second (smooth to the eye)."""

RENDER_WAIT_MAX = 1.0
"""The longest wait between redraws, whatever they cost: the reply must be seen to move."""

RENDER_SHARE = 0.02
"""The most of a CPU the screen may spend while a reply streams. On a CPU
llama.cpp decodes on every core, so what the screen draws is taken from
decoding, and re-rendering a growing Markdown reply costs more each time. The
screen measures its own CPU time and waits long enough after each redraw to
stay within this share."""


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

    def __init__(self, node: MessagePump, redraw: Callable[[], Awaitable[None]]) -> None:
        self._node, self._redraw = node, redraw
        self._cpu = time.thread_time()
        self._timer = node.set_timer(1 / RENDER_HZ, self._tick)

    async def _tick(self) -> None:
        await self._redraw()
        cpu = time.thread_time()
        spent, self._cpu = cpu - self._cpu, cpu
        wait = min(max(1 / RENDER_HZ, spent / RENDER_SHARE), RENDER_WAIT_MAX)
        self._timer = self._node.set_timer(wait, self._tick)

    def stop(self) -> None:
        self._timer.stop()

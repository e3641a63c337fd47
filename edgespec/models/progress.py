"""Progress of long file work (download, assembly, hashing) as small events.

The CLI draws them with rich (edgespec.cli.bars), the chat app as a progress
widget; both get the same `Progress` through a plain callback.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Optional


@dataclass(frozen=True)
class Progress:
    """Where one file's work stands."""

    file: str
    """File name (no directory)."""
    done: int
    """Bytes done so far."""
    total: int | None
    """Bytes in all, when known."""
    speed: float
    """Bytes per second, averaged over the work so far."""
    eta: float | None
    """Seconds left, when the total is known and speed is positive."""
    stage: str = "download"
    """"download", "assemble", "quantize" or "verify"."""

    @property
    def fraction(self) -> float | None:
        return self.done / self.total if self.total else None

    @property
    def finished(self) -> bool:
        return self.total is not None and self.done >= self.total


ProgressCallback = Callable[[Progress], None]


class Meter:
    """Counts bytes for one file and reports to a callback, at most every `interval`
    seconds (and always at the start and the end)."""

    def __init__(self, callback: Optional[ProgressCallback], file: str, total: int | None,
                 *, stage: str = "download", interval: float = 0.1, initial: int = 0):
        self.callback, self.file, self.total, self.stage = callback, file, total, stage
        self.interval = interval
        self.done = initial
        self._start_bytes = initial
        self._start = time.monotonic()
        self._last = 0.0
        self._last_done: int | None = None
        self._report(force=True)

    def update(self, n: int) -> None:
        self.done += n
        self._report()

    def set(self, done: int) -> None:
        self.done = done
        self._report()

    def close(self) -> None:
        self._report(force=True)

    def poke(self) -> None:
        """Report the same numbers again while nothing comes (a stalled server, a pause between
        tries), so that the callback can stop the work: the app's Cancel raises from it. Not once
        the work is finished, whose last report closes a progress bar."""
        if not (self.total is not None and self.done >= self.total):
            self._last_done = None
            self._report(force=True)

    def _report(self, force: bool = False) -> None:
        if self.callback is None or self.done == self._last_done:
            return
        now = time.monotonic()
        if not force and now - self._last < self.interval and not (self.total and self.done >= self.total):
            return
        self._last, self._last_done = now, self.done
        elapsed = now - self._start
        speed = (self.done - self._start_bytes) / elapsed if elapsed > 0 else 0.0
        eta = (self.total - self.done) / speed if self.total is not None and speed > 0 else None
        self.callback(Progress(self.file, self.done, self.total, speed, eta, self.stage))


def human_bytes(n: float | None) -> str:
    """1234567 -> "1.2 MB" (decimal units, as the hub shows sizes)."""
    if n is None:
        return "?"
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"


def human_seconds(s: float) -> str:
    """90 -> "2 min", 7200 -> "2 h" (rounded: for a wait a person plans around)."""
    if s < 90:
        return f"{s:.0f} s"
    if s < 90 * 60:
        return f"{s / 60:.0f} min"
    return f"{s / 3600:.0f} h"

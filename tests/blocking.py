"""Calls that must not block on a FIFO put where edgespec keeps a file."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Callable, TypeVar

T = TypeVar("T")


def returns_without_blocking(fifo: Path, call: Callable[[], T], seconds: float = 10) -> T:
    """call()'s result, run in a thread; AssertionError where it has not returned within
    `seconds` (a read blocked on `fifo` until a writer comes), after letting it go."""
    outcome: dict = {}

    def run() -> None:
        try:
            outcome["value"] = call()
        except BaseException as e:  # noqa: BLE001 (raised again in the test's thread)
            outcome["error"] = e

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(seconds)
    if worker.is_alive():
        unblock(fifo)
        raise AssertionError(f"still blocked after {seconds} s: reading {fifo}?")
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


def unblock(fifo: Path) -> None:
    """Open the FIFO for writing and close it, so that a reader blocked on it returns."""
    try:
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
    except OSError:
        pass

"""SIGTERM and SIGHUP while a command holds the models: they end it as Ctrl+C does.

Python's default ends the process at once, skipping what closing the engine saves (the
lookup pool, the drafter's memory of earlier text; the KV snapshots). Within `unwinding`,
such a signal raises Terminated where the command is, which unwinds (a chat's reply
stored as far as it went, the engine closed), and the launcher then ends the process by
the signal, as a shell expects of any program (143, 129).
"""

from __future__ import annotations

import contextlib
import signal
import threading
from typing import Iterator

from edgespec.errors import ENDING_SIGNALS, Terminated


@contextlib.contextmanager
def unwinding() -> Iterator[None]:
    """ENDING_SIGNALS raise Terminated within the block, entered once the models are loaded: a
    load calls back into Python, where ctypes drops what a handler raises. Another signal while
    the command unwinds (the handlers restored) ends it at once, as Python's default does: the
    saving cut short, as by a second Ctrl+C. Only on the main thread, where handlers run."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, _raise) for sig in ENDING_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _raise(signum: int, _frame) -> None:
    raise Terminated(signum)

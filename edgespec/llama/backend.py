"""llama.cpp's backend, once per process: its initialisation and edgespec's log
handler, which keeps llama.cpp quiet and remembers what failures need (recent
error lines, where the last model load put each layer). Every module of this
package that calls llama.cpp starts here."""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import signal
import threading
import time
from collections import deque
from typing import Callable, Iterator

import llama_cpp

_LOG_WARN = 3  # ggml_log_level: NONE, DEBUG, INFO, WARN, ERROR, CONT
_LOG_ERROR = 4
_LOG_CONT = 5

_init_lock = threading.Lock()
_initialised = False
_recent_errors: deque[str] = deque(maxlen=8)
_last_level = 0
_layer_devices: dict[int, str] = {}
"""Where llama.cpp's last model load put each layer (from its debug log)."""
_LAYER_LINE = re.compile(r"load_tensors: layer +(\d+) assigned to device (\S+),")
_verbose = bool(os.environ.get("EDGESPEC_DEBUG"))


@llama_cpp.llama_log_callback
def _log(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
    """Keep llama.cpp quiet (its load logs would scribble over the chat app);
    remember recent warnings and errors so that failures can say why.
    EDGESPEC_DEBUG=1 shows all."""
    global _last_level
    level = _last_level if level == _LOG_CONT else level
    _last_level = level
    line = text.decode("utf-8", errors="replace")
    placed = _LAYER_LINE.match(line)
    if placed:
        _layer_devices[int(placed.group(1))] = placed.group(2)
    if level in (_LOG_WARN, _LOG_ERROR) and any(c.isalpha() for c in line):
        _recent_errors.append(line.strip())
    if _verbose:
        os.write(2, text)


_sigint_noted = False


@contextlib.contextmanager
def sigint_noted(*, here: bool = True) -> Iterator[Callable[[], bool]]:
    """Ctrl+C (SIGINT) noted instead of raised, for a long llama.cpp call that calls
    back into Python (loading a model: its log, its progress): raised inside a
    callback, ctypes prints KeyboardInterrupt and drops it, and the call and the
    command go on. Yields whether one came; meanwhile loading_progress tells a load to
    stop. Only where SIGINT raises KeyboardInterrupt (the main thread, Python's own
    handler), and where the call runs on this thread (`here`): one run on another
    (an RPC guard's) leaves this one waiting in Python, where Ctrl+C is raised as
    usual, and its progress may never come while a worker does not answer."""
    global _sigint_noted
    if (not here or threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGINT) is not signal.default_int_handler):
        yield lambda: False
        return
    _sigint_noted, noted = False, []

    def note(signum, frame) -> None:
        global _sigint_noted
        _sigint_noted = True
        noted.append(signum)

    signal.signal(signal.SIGINT, note)
    try:
        yield lambda: bool(noted)  # (still true once the block has ended)
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        _sigint_noted = False


_load_began = 0.0
"""When the load running now began (time.monotonic; loads run one at a time)."""
_loads_stopped = -1.0
"""When the loads running then were told to stop (stop_loads)."""
_first_progress: Callable[[], None] | None = None
"""Called at the load's first progress report, once its buffers are allocated and
before its weights are read into them."""


def load_began(first_progress: Callable[[], None] | None = None) -> None:
    """A model load begins now (the loading thread calls it, under the load lock);
    `first_progress` runs at its first progress report and must not raise."""
    global _load_began, _first_progress
    _load_began = time.monotonic()
    _first_progress = first_progress


def stop_loads() -> None:
    """From any thread: the model load running now ends at its next progress report (an
    app quitting need not wait for it); loads begun later are not stopped."""
    global _loads_stopped
    _loads_stopped = time.monotonic()


def load_stopped() -> bool:
    """Whether the load running now was told to stop (stop_loads)."""
    return _loads_stopped >= _load_began


def loading_progress(fraction: float) -> bool:
    """Whether llama.cpp goes on loading a model (`fraction` of it done): not once
    Ctrl+C was noted (sigint_noted), nor once told to stop (stop_loads)."""
    global _first_progress
    hook, _first_progress = _first_progress, None
    if hook is not None:
        hook()
    return not (_sigint_noted or load_stopped())


@llama_cpp.llama_progress_callback
def load_progress_callback(fraction: float, user_data: ctypes.c_void_p) -> bool:
    """llama_model_params.progress_callback: asks loading_progress."""
    return loading_progress(fraction)


def backend_init() -> None:
    """llama_backend_init, once per process, with edgespec's log handler."""
    global _initialised
    with _init_lock:
        if not _initialised:
            llama_cpp.llama_log_set(_log, ctypes.c_void_p(0))
            llama_cpp.llama_backend_init()
            _initialised = True


def recent_errors() -> str:
    """llama.cpp's latest error lines, for error messages; clears them."""
    text = " ".join(line for line in _recent_errors if line)
    _recent_errors.clear()
    return text


def take_layer_devices() -> dict[int, str]:
    """Which device llama.cpp's last model load gave each layer (the output layer is
    number n_layer); clears the record."""
    placed = dict(_layer_devices)
    _layer_devices.clear()
    return placed

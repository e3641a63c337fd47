"""llama.cpp's backend, once per process: its initialisation and edgespec's log
handler, which keeps llama.cpp quiet and remembers what failures need (recent
error lines, where the last model load put each layer). Every module of this
package that calls llama.cpp starts here."""

from __future__ import annotations

import ctypes
import os
import re
import threading
from collections import deque

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

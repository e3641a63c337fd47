"""The thin layer over llama.cpp: the only package that touches ctypes.

One small class per llama.cpp object (model.py, context.py, batch.py), methods
named after the C calls they wrap, explicit freeing. Nothing above this
package sees a pointer.
"""

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


def system_info() -> dict:
    """Which backend llama.cpp was built with, for `edgespec --version` and the app."""
    backend_init()
    info = llama_cpp.llama_print_system_info().decode("utf-8", errors="replace")
    from edgespec.llama import rpc

    # llama_supports_gpu_offload is also true for a CPU build with RPC: ask for a local GPU
    gpu = bool(llama_cpp.llama_supports_gpu_offload()) and any(
        d.kind in ("GPU", "iGPU") for _, d in rpc.local_devices())
    upper = info.upper()
    if "METAL" in upper or "MTL" in upper:
        backend = "metal"
    elif "CUDA" in upper:
        backend = "cuda"
    elif "VULKAN" in upper:
        backend = "vulkan"
    else:
        backend = "cpu"
    return {
        "backend": backend,
        "gpu_offload": gpu,
        "rpc": rpc.available(),
        "llama_cpp_python": llama_cpp.__version__,
        "system_info": info.strip(),
    }

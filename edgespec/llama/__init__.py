"""The thin layer over llama.cpp: the only package that touches ctypes.

One small class per llama.cpp object (model.py, context.py, batch.py), methods
named after the C calls they wrap, explicit freeing. Nothing above this
package sees a pointer. backend.py initialises llama.cpp and holds its log;
this face tells what llama.cpp was built with (system_info). The package's own
modules import from backend.py, never from here.
"""

from __future__ import annotations

import llama_cpp

from edgespec.llama import rpc
from edgespec.llama.backend import backend_init


def system_info() -> dict:
    """Which backend llama.cpp was built with, for `edgespec --version` and the app."""
    backend_init()
    info = llama_cpp.llama_print_system_info().decode("utf-8", errors="replace")
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

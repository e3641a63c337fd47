"""llama.cpp's own quantizer (llama_model_quantize): a GGUF file to another type.

Used to make a draft model cheaper to run on a CPU: the target checks every
guess, so a coarser draft changes speed, never the output.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import llama_cpp

from edgespec.errors import ModelFileError
from edgespec.llama.backend import backend_init, recent_errors

TYPES = {
    "q4_0": (llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_0, llama_cpp.GGML_TYPE_Q4_0),
    "q8_0": (llama_cpp.LLAMA_FTYPE_MOSTLY_Q8_0, llama_cpp.GGML_TYPE_Q8_0),
}
"""Target types: the file type, and the type given to the output and token embedding tensors too."""


def quantize(src: Path, dst: Path, type_name: str, *, n_threads: int = 0) -> None:
    """Write `src` requantized to `type_name` (every weight matrix, the output
    layer included) as `dst`."""
    if type_name not in TYPES:
        raise ValueError(f"unknown type {type_name!r}: choose one of {', '.join(TYPES)}")
    backend_init()
    ftype, tensor_type = TYPES[type_name]
    params = llama_cpp.llama_model_quantize_default_params()
    params.nthread = n_threads  # 0: all cores
    params.ftype = ftype
    params.allow_requantize = True  # the source is itself quantized
    params.output_tensor_type = tensor_type
    params.token_embedding_type = tensor_type
    rc = llama_cpp.llama_model_quantize(str(src).encode(), str(dst).encode(), ctypes.byref(params))
    if rc != 0:
        raise ModelFileError(f"quantizing {src} to {type_name} failed ({recent_errors() or f'code {rc}'})")

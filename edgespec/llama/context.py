"""LlamaContext: owns one llama_context (KV cache, logits) of a LlamaModel."""

from __future__ import annotations

import ctypes
import os
import time

import llama_cpp
import numpy as np

from edgespec.errors import ContextFullError, ModelLoadError
from edgespec.llama.backend import recent_errors, sigint_noted
from edgespec.llama.batch import LlamaBatch
from edgespec.llama.model import LlamaModel


class DecodeAborted(Exception):
    """llama_decode stopped because LlamaContext.abort asked it to; the batch it was
    reading is not in the cache (llama.cpp removes it)."""


def _flag_reader():
    """An abort callback llama.cpp can call without Python: libc's strlen, handed a
    two-byte flag (b"\\0\\0": go on, b"\\1\\0": stop) and returning 0 or 1, which
    the caller reads as its bool. llama.cpp asks at every node of every graph; a
    Python callback would take the GIL each time. None where libc is not found."""
    try:
        libc = ctypes.cdll.msvcrt if os.name == "nt" else ctypes.CDLL(None)
        return llama_cpp.ggml_abort_callback(ctypes.cast(libc.strlen, ctypes.c_void_p).value)
    except (OSError, AttributeError):
        return None


_READ_FLAG = _flag_reader()


class LlamaContext:
    """llama_init_from_model ... llama_free. Holds up to n_seq_max sequences in one
    unified KV cache: every sequence may use all n_ctx cells, together at most n_ctx."""

    KV_TYPES = {"f16": 1, "q8_0": 8}
    """ggml types for the KV cache (llama.cpp's --cache-type-k/-v)."""

    def __init__(self, model: LlamaModel, *, n_ctx: int, n_batch: int = 512,
                 n_threads: int | None = None, kv_type: str = "f16", flash_attn: bool | None = None,
                 n_seq_max: int = 1, n_ubatch: int | None = None):
        """flash_attn None lets llama.cpp decide; a quantized KV cache needs it on.
        `n_ubatch`: the tokens llama.cpp computes at once within a batch (None: n_batch)."""
        self.model = model
        threads = n_threads or os.cpu_count() or 1
        params = llama_cpp.llama_context_default_params()
        params.n_ctx = n_ctx
        params.n_batch = n_batch
        params.n_ubatch = min(n_ubatch or n_batch, n_batch)
        params.n_seq_max = n_seq_max
        params.kv_unified = True
        params.n_threads = threads
        params.n_threads_batch = threads
        params.no_perf = True
        params.type_k = params.type_v = self.KV_TYPES[kv_type]
        if flash_attn is not None:
            params.flash_attn_type = 1 if flash_attn else 0
        with sigint_noted(here=model.guard is None) as interrupted:  # allocating the caches logs through a callback
            self._ctx = model.call(llama_cpp.llama_init_from_model, model.ptr, params)
        if interrupted():
            if self._ctx:
                llama_cpp.llama_free(self._ctx)
            raise KeyboardInterrupt
        if not self._ctx:
            why = recent_errors() or "llama.cpp gave no reason"
            raise ModelLoadError(f"could not create a {n_ctx}-token context for {model.path.name}: {why}")
        self._memory = llama_cpp.llama_get_memory(self._ctx)
        self.n_batch = llama_cpp.llama_n_batch(self._ctx)
        """Most tokens one llama_decode takes: llama.cpp lowers the n_batch asked for
        to the n_ctx asked for, and then may round n_ctx itself up."""
        self.n_ubatch = llama_cpp.llama_n_ubatch(self._ctx)
        """Tokens llama.cpp computes at once within a batch."""
        self.n_vocab = model.n_vocab
        self.flash_attn = flash_attn
        """As asked: None when llama.cpp decided."""
        self.kv_type = kv_type
        self.n_seq_max = n_seq_max
        self.decode_s = 0.0
        """Seconds spent inside llama_decode (to tell llama.cpp's time from ours)."""
        self.decoded = 0
        """Tokens decoded, in every sequence (a counter for stats and tests)."""
        self._abort = ctypes.create_string_buffer(2)
        if _READ_FLAG is not None:
            llama_cpp.llama_set_abort_callback(self._ctx, _READ_FLAG, ctypes.cast(self._abort, ctypes.c_void_p))

    def n_ctx(self) -> int:
        return llama_cpp.llama_n_ctx(self._ctx)

    def decode(self, batch: LlamaBatch) -> None:
        """llama_decode; raises when llama.cpp refuses the batch."""
        start = time.perf_counter()
        rc = self.model.call(self._decode, batch.struct)
        self.decode_s += time.perf_counter() - start
        self.decoded += batch.struct.n_tokens
        if rc == 1:
            raise ContextFullError(f"no room in the {self.n_ctx()}-token context for {batch.struct.n_tokens} more tokens")
        if rc == 2:
            raise DecodeAborted(f"a decode of {batch.struct.n_tokens} tokens was stopped")
        if rc != 0:
            raise RuntimeError(f"llama_decode failed with code {rc}: {recent_errors()}")

    def abort(self, stop: bool = True) -> None:
        """From any thread: make the llama_decode in progress, and every later one
        until abort(False), stop at its next graph node and raise DecodeAborted
        (llama_set_abort_callback; where libc is not found, decodes run to their end)."""
        self._abort[0] = b"\x01" if stop else b"\x00"

    def _decode(self, batch) -> int:
        rc = llama_cpp.llama_decode(self._ctx, batch)
        llama_cpp.llama_synchronize(self._ctx)  # the work may finish after llama_decode returns
        return rc

    def get_logits_ith(self, i: int) -> np.ndarray:
        """Logits of the i-th output of the last batch (negative counts from the end).
        A view into llama.cpp's buffer: valid until the next decode."""
        ptr = llama_cpp.llama_get_logits_ith(self._ctx, i)
        if not ptr:
            raise IndexError(f"no logits for output {i} of the last batch")
        return np.ctypeslib.as_array(ptr, shape=(self.n_vocab,))

    def memory_seq_rm(self, seq_id: int, p0: int, p1: int = -1) -> None:
        """Remove positions [p0, p1) of a sequence from the KV cache (p1 < 0: to the end)."""
        if not self.model.call(llama_cpp.llama_memory_seq_rm, self._memory, seq_id, p0, p1):
            raise RuntimeError(f"llama.cpp could not remove KV positions {p0}..{p1} (a non-trimmable cache?)")

    def memory_clear(self) -> None:
        self.model.call(llama_cpp.llama_memory_clear, self._memory, True)

    def state_seq_get_data(self, seq_id: int) -> bytes:
        """A sequence's KV state (its cells and their keys and values), as bytes."""
        size = self.model.call(llama_cpp.llama_state_seq_get_size, self._ctx, seq_id)
        buf = (ctypes.c_uint8 * size)()
        n = self.model.call(llama_cpp.llama_state_seq_get_data, self._ctx, buf, size, seq_id)
        return bytes(memoryview(buf)[:n])

    def state_seq_set_data(self, seq_id: int, data: bytes) -> bool:
        """Load a state from state_seq_get_data into an empty sequence; False when
        llama.cpp refuses it (no room, or not a state of this model and cache)."""
        src = ctypes.cast(ctypes.c_char_p(data), ctypes.POINTER(ctypes.c_uint8))  # no copy: llama.cpp only reads it
        n = self.model.call(llama_cpp.llama_state_seq_set_data, self._ctx, src, len(data), seq_id)
        if n == 0:
            self.memory_seq_rm(seq_id, 0)  # a failed load may leave part of it
        return n != 0

    def close(self) -> None:
        """llama_free; a context whose worker was lost is abandoned (see LlamaModel.close)."""
        if self._ctx is not None:
            ctx, self._ctx, self._memory = self._ctx, None, None
            guard = self.model.guard
            if not (guard and guard.lost):
                self.model.call(llama_cpp.llama_free, ctx)

    def __enter__(self) -> "LlamaContext":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

"""LlamaModel: owns one llama_model (weights) and reads its vocabulary and its attention's shape."""

from __future__ import annotations

import ctypes
import threading
from dataclasses import dataclass
from pathlib import Path

import llama_cpp

from edgespec.errors import ModelFileError, ModelLoadError
from edgespec.llama import rpc
from edgespec.llama.backend import (backend_init, load_began, load_progress_callback, load_stopped, recent_errors,
                                    sigint_noted, take_layer_devices)
from edgespec.llama.hugepages import NewMemory
from edgespec.net import Split

GGUF_MAGIC = b"GGUF"
VOCAB_TYPES = {0: "none", 1: "llama", 2: "gpt2", 3: "wpm", 4: "ugm", 5: "rwkv", 6: "plamo2"}
"""llama_vocab_type values; names as in GGUF's tokenizer.ggml.model."""


@dataclass(frozen=True)
class AttentionShape:
    """What the cost of a model's attention depends on, besides the context."""

    n_head: int
    n_head_kv: int
    head_k: int
    """Size of a key head (and of a query head)."""
    head_v: int


def check_gguf_file(path: Path) -> None:
    """Raise ModelFileError unless `path` is an existing file that starts like a GGUF."""
    if not path.exists():
        raise ModelFileError(f"model file not found: {path}")
    if not path.is_file():
        raise ModelFileError(f"not a file: {path}")
    with path.open("rb") as f:
        magic = f.read(4)
    if magic != GGUF_MAGIC:
        raise ModelFileError(
            f"{path} is not a GGUF model file (it starts with {magic!r}, expected b'GGUF'); "
            "download it again or pass another file"
        )


_load_lock = threading.Lock()
"""One load at a time: the layer placement is read from the load's log."""


class LlamaModel:
    """A loaded GGUF model: llama_model_load_from_file ... llama_model_free."""

    def __init__(self, path: str | Path, *, n_gpu_layers: int = 0, vocab_only: bool = False,
                 extra_bufts: bool = True, split: Split | None = None):
        """extra_bufts=False keeps the weights in plain layouts (no CPU repacking):
        slower, but every batch size then takes the same matrix kernels
        (scripts/exact_kernels.py measures what that costs and keeps exact).
        `split` puts the offloaded layers (n_gpu_layers) on RPC workers' devices
        and this machine's GPUs, weighted by split.tensor_split (default: by free
        memory); the other layers stay on this machine's CPU."""
        self.path = Path(path)
        check_gguf_file(self.path)
        backend_init()
        params = llama_cpp.llama_model_default_params()
        params.n_gpu_layers = 2**31 - 1 if n_gpu_layers < 0 else n_gpu_layers
        params.vocab_only = vocab_only
        params.use_extra_bufts = extra_bufts
        self.guard: rpc.Guard | None = None
        """Runs llama.cpp calls that may reach a worker (None: the model is all local)."""
        self.devices: list[rpc.Device] = []
        """The devices in llama_model_params.devices (with a split)."""
        if split is not None:
            keep = self._set_devices(params, split)  # noqa: F841 (the arrays must outlive the load)
        params.progress_callback = load_progress_callback
        with _load_lock, sigint_noted(here=self.guard is None) as interrupted:
            memory = NewMemory()
            load_began(first_progress=memory.advise)
            take_layer_devices()
            self._model = self.call(llama_cpp.llama_model_load_from_file, str(self.path).encode(), params)
            self.huge_pages = memory.collapse() if self._model else 0
            """Bytes of the memory the load allocated that are in huge pages (hugepages.py):
            0 where the weights are elsewhere (mmapped, on a GPU) or the system gave none."""
            self.layer_devices = take_layer_devices()
            """Which device each layer is on (layer n_layer is the output layer); {} if llama.cpp did not say."""
            if interrupted():
                if self._model:
                    self.close()
                elif self.guard:
                    self.guard.close()
                raise KeyboardInterrupt
        if split is not None and split.local_output and self.layer_devices:
            self.layer_devices[max(self.layer_devices)] = "CPU"  # its weights were overridden to the CPU
        if not self._model:
            if self.guard:
                self.guard.close()
            if load_stopped():
                recent_errors()
                raise ModelLoadError(f"loading {self.path} was stopped")
            why = recent_errors() or "llama.cpp gave no reason"
            raise ModelLoadError(f"llama.cpp could not load {self.path}: {why}")
        self._vocab = llama_cpp.llama_model_get_vocab(self._model)
        self.n_vocab = llama_cpp.llama_vocab_n_tokens(self._vocab)

    def _set_devices(self, params, split: Split):
        """The workers' devices, then this machine's GPUs, into params (as llama.cpp's --rpc orders them)."""
        found = rpc.add_servers(split.workers) + rpc.offload_devices()
        if split.tensor_split and len(split.tensor_split) != len(found):
            raise ModelLoadError(
                f"--tensor-split has {len(split.tensor_split)} weights for {len(found)} devices "
                f"({', '.join(d.label for _, d in found)}): give one weight per device")
        self.guard = rpc.Guard(split.workers)
        self.devices = [d for _, d in found]
        ptrs = (ctypes.c_void_p * (len(found) + 1))(*[p for p, _ in found], None)
        params.devices = ctypes.cast(ptrs, ctypes.c_void_p)
        weights = (ctypes.c_float * llama_cpp.llama_max_devices())(*split.tensor_split)
        params.tensor_split = weights
        overrides = rpc.local_output_overrides() if split.local_output else None
        if overrides is not None:
            params.tensor_buft_overrides = ctypes.cast(overrides, ctypes.c_void_p)
        return ptrs, weights, overrides

    def call(self, fn, *args):
        """fn(*args), through the guard when the model has layers on workers."""
        return self.guard.call(fn, *args) if self.guard is not None else fn(*args)

    # -- model -----------------------------------------------------------
    @property
    def ptr(self):
        """The llama_model pointer, for LlamaContext only."""
        if self._model is None:
            raise RuntimeError(f"model {self.path.name} is closed")
        return self._model

    def n_layer(self) -> int:
        return llama_cpp.llama_model_n_layer(self.ptr)

    def n_head(self) -> int:
        return llama_cpp.llama_model_n_head(self.ptr)

    def attention_shape(self) -> AttentionShape:
        """Heads and head sizes (GGUF's attention.key_length/value_length, else n_embd / n_head)."""
        n_head = max(1, self.n_head())
        default = llama_cpp.llama_model_n_embd(self.ptr) // n_head
        return AttentionShape(n_head, llama_cpp.llama_model_n_head_kv(self.ptr) or n_head,
                              self._meta_int("attention.key_length", default),
                              self._meta_int("attention.value_length", default))

    def _meta_int(self, key: str, default: int) -> int:
        """An integer of the model's GGUF metadata under its architecture's prefix."""
        buf = ctypes.create_string_buffer(64)
        arch = buf.value if llama_cpp.llama_model_meta_val_str(self.ptr, b"general.architecture", buf, 64) > 0 else b""
        n = llama_cpp.llama_model_meta_val_str(self.ptr, arch + b"." + key.encode(), buf, 64)
        return int(buf.value) if n > 0 and buf.value.isdigit() else default

    def desc(self) -> str:
        buf = ctypes.create_string_buffer(256)
        llama_cpp.llama_model_desc(self.ptr, buf, len(buf))
        return buf.value.decode("utf-8", errors="replace")

    def chat_template(self) -> str | None:
        raw = llama_cpp.llama_model_chat_template(self.ptr, None)
        return raw.decode("utf-8", errors="replace") if raw else None

    # -- vocabulary ------------------------------------------------------
    def vocab_type(self) -> str:
        return VOCAB_TYPES.get(llama_cpp.llama_vocab_type(self._vocab), "unknown")

    def bos(self) -> int | None:
        return _token(llama_cpp.llama_vocab_bos(self._vocab))

    def eos(self) -> int | None:
        return _token(llama_cpp.llama_vocab_eos(self._vocab))

    def fim_pre(self) -> int | None:
        """The fill-in-the-middle token that opens the text before the gap (llama_vocab_fim_pre)."""
        return _token(llama_cpp.llama_vocab_fim_pre(self._vocab))

    def fim_suf(self) -> int | None:
        """The one that opens the text after the gap (llama_vocab_fim_suf)."""
        return _token(llama_cpp.llama_vocab_fim_suf(self._vocab))

    def fim_mid(self) -> int | None:
        """The one after which the model writes the gap's text (llama_vocab_fim_mid)."""
        return _token(llama_cpp.llama_vocab_fim_mid(self._vocab))

    def add_bos(self) -> bool:
        return bool(llama_cpp.llama_vocab_get_add_bos(self._vocab))

    def is_eog(self, token: int) -> bool:
        return bool(llama_cpp.llama_vocab_is_eog(self._vocab, token))

    def get_text(self, token: int) -> str:
        """The token's text as stored in the vocabulary (llama_vocab_get_text)."""
        raw = llama_cpp.llama_vocab_get_text(self._vocab, token)
        return raw.decode("utf-8", errors="replace") if raw else ""

    def tokenize(self, text: str, *, add_special: bool, parse_special: bool) -> list[int]:
        data = text.encode("utf-8")
        n_max = len(data) + 8
        buf = (llama_cpp.llama_token * n_max)()
        n = llama_cpp.llama_tokenize(self._vocab, data, len(data), buf, n_max, add_special, parse_special)
        if n < 0:  # buffer too small: -n is the size needed
            n_max = -n
            buf = (llama_cpp.llama_token * n_max)()
            n = llama_cpp.llama_tokenize(self._vocab, data, len(data), buf, n_max, add_special, parse_special)
        return list(buf[:n])

    def token_to_piece(self, token: int, *, special: bool = True) -> bytes:
        """The bytes a token stands for; a piece may be part of a UTF-8 character."""
        buf = ctypes.create_string_buffer(64)
        n = llama_cpp.llama_token_to_piece(self._vocab, token, buf, len(buf), 0, special)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = llama_cpp.llama_token_to_piece(self._vocab, token, buf, len(buf), 0, special)
        return buf.raw[:n]

    # -- lifetime --------------------------------------------------------
    def close(self) -> None:
        """llama_model_free; a model whose worker was lost is abandoned instead
        (freeing it would wait forever on the lost connection)."""
        if self._model is not None:
            model, self._model, self._vocab = self._model, None, None
            if not (self.guard and self.guard.lost):
                self.call(llama_cpp.llama_model_free, model)
            if self.guard:
                self.guard.close()

    def __enter__(self) -> "LlamaModel":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _token(token: int) -> int | None:
    """A special token's id as the vocabulary gives it, or None where it has none (LLAMA_TOKEN_NULL, -1)."""
    return None if token < 0 else token

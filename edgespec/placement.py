"""Where the models' layers run: this machine's GPUs and what each model needs
in their memory, turned into how many layers of the target and the draft to
offload (llama.cpp's n_gpu_layers). Pure: the devices come from
edgespec.llama.rpc, the models' sizes from their GGUF headers, and load.py
asks here for every face.

The rule: both models wholly on the GPU if they fit together; else the draft
wholly (it is small) and as many of the target's layers as fit, the rest on
the CPU; with no GPU, none. A count the user gives is kept, and the other
model is placed in what it leaves.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any, Mapping, Protocol, Sequence

from edgespec.errors import ModelLoadError

MIB = 1 << 20
MARGIN_BYTES = 256 * MIB
"""Memory left free on each GPU: what the estimate misses (the backend's own
buffers, a desktop's windows, another program's allocations)."""
FREE_CAP_ENV = "EDGESPEC_GPU_FREE_MIB"
"""Environment variable: count at most this many MiB free on each GPU (headroom
for other programs; tests use it to pretend a smaller GPU)."""
OFFLOAD_KINDS = ("GPU", "iGPU")
"""ggml device kinds that take offloaded layers."""
KV_BYTES = {"f32": 4.0, "f16": 2.0, "q8_0": 34 / 32}
"""Bytes per value of a KV cache type (q8_0: blocks of 32 values in 34 bytes)."""

_LAYER_TENSOR = re.compile(r"^blk\.(\d+)\.")


class DeviceMemory(Protocol):
    """A device as placement sees it (edgespec.llama.rpc.Device is one)."""

    name: str
    kind: str
    """CPU, GPU, iGPU."""
    free: int
    """Bytes free."""


@dataclass(frozen=True)
class ModelNeed:
    """What one model takes in GPU memory, in bytes, layer by layer."""

    layers: tuple[int, ...]
    """Each repeating layer (blk.N): its weights and its share of the KV cache."""
    output: int
    """The output layer: its matrix (or the tied token embeddings) and norm."""
    compute: int
    """The compute buffer, needed once any layer is offloaded."""

    @property
    def n_layers(self) -> int:
        """Layers as llama.cpp counts them for n_gpu_layers: the repeating ones and the output."""
        return len(self.layers) + 1

    def bytes(self, n: int) -> int:
        """GPU memory for n offloaded layers: llama.cpp offloads the last n
        repeating layers, and the output layer only once all of them are."""
        if n <= 0:
            return 0
        layers = sum(self.layers[len(self.layers) - min(n, len(self.layers)):])
        return layers + self.compute + (self.output if n >= self.n_layers else 0)

    def most_layers(self, budget: int) -> int:
        """The most layers whose bytes fit in `budget`."""
        return max((n for n in range(self.n_layers + 1) if self.bytes(n) <= budget), default=0)

    @classmethod
    def from_gguf(cls, meta: Mapping[str, Any], tensor_sizes: Mapping[str, int], *, n_ctx: int,
                  n_batch: int = 512, kv_type: str = "f16") -> ModelNeed:
        """From a GGUF header (gguf_header.read_tensor_sizes): the weights by
        tensor name, the KV cache from n_ctx, the KV heads, the head sizes and
        `kv_type`, and an estimate of the compute buffer."""
        arch = meta.get("general.architecture")

        def key(name: str, default: int) -> int:
            value = meta.get(f"{arch}.{name}")
            return value if isinstance(value, int) else default  # per-layer arrays: the default

        n_layer = key("block_count", 0)
        n_embd = key("embedding_length", 0)
        n_head = key("attention.head_count", 1) or 1
        kv_layer = int(n_ctx * _kv_values_per_token_layer(meta) * KV_BYTES.get(kv_type, 2.0))
        weights = [0] * n_layer
        for name, size in tensor_sizes.items():
            match = _LAYER_TENSOR.match(name)
            if match and int(match[1]) < n_layer:
                weights[int(match[1])] += size
        output = tensor_sizes.get("output.weight", tensor_sizes.get("token_embd.weight", 0))
        output += tensor_sizes.get("output_norm.weight", 0)
        # one batch's logits, its widest activation and (unfused) attention scores over the context
        n_vocab = meta.get("n_vocab") or key("vocab_size", 0)
        compute = 4 * n_batch * (n_vocab + key("feed_forward_length", 4 * n_embd) + n_ctx * n_head)
        return cls(tuple(w + kv_layer for w in weights), output, compute)


def _kv_values_per_token_layer(meta: Mapping[str, Any]) -> int:
    """Values one token adds to one layer's KV cache: its KV heads times the key and value head sizes."""
    arch = meta.get("general.architecture")

    def key(name: str, default: int) -> int:
        value = meta.get(f"{arch}.{name}")
        return value if isinstance(value, int) else default

    n_embd = key("embedding_length", 0)
    n_head = key("attention.head_count", 1) or 1
    n_head_kv = key("attention.head_count_kv", n_head)
    return n_head_kv * (key("attention.key_length", n_embd // n_head) + key("attention.value_length", n_embd // n_head))


# -- the context size -------------------------------------------------------------------

CTX_CHOICES = (8192, 16384, 32768)
"""Context sizes chosen from when none is given: the largest that fits (fit_context)."""
CTX_FLOOR = 4096
"""The context chosen when none of CTX_CHOICES fits: never less."""
CTX_MEMORY_SHARE = 0.25
"""The share of this machine's available memory that the KV caches of target and
draft may take together at the chosen context size."""


@dataclass(frozen=True)
class ContextNeed:
    """What one model's context costs per token, and the longest it was trained on."""

    kv_per_token: int
    """Bytes its KV cache holds per token (all layers, keys and values)."""
    n_head: int
    """Attention heads: the unfused attention's scores take n_ctx x n_batch x n_head floats."""
    n_ctx_train: int | None = None
    """The GGUF's context_length; None where it does not say."""

    @classmethod
    def from_gguf(cls, meta: Mapping[str, Any], *, kv_type: str = "f16") -> ContextNeed:
        arch = meta.get("general.architecture")
        layers, heads, train = (meta.get(f"{arch}.{name}") for name in
                                ("block_count", "attention.head_count", "context_length"))
        return cls(int(_kv_values_per_token_layer(meta) * KV_BYTES.get(kv_type, 2.0)) * (layers or 0),
                   heads if isinstance(heads, int) and heads > 0 else 1,
                   train if isinstance(train, int) and train > 0 else None)


def fit_context(models: Sequence[ContextNeed], available: int | None, *, share: float = CTX_MEMORY_SHARE,
                scores_max: int | None = None, n_batch: int = 512) -> int:
    """The context size to load `models` (target and draft) with when none is given:
    the largest of CTX_CHOICES that every model was trained for, whose KV caches
    together take at most `share` of `available` bytes (None: unknown, so the
    smallest choice), and, with `scores_max`, at which each model's unfused
    attention scores for one batch take at most that many bytes (beyond, the
    kernel chosen for this machine would change); never less than CTX_FLOOR."""
    trained = min((m.n_ctx_train for m in models if m.n_ctx_train), default=None)

    def fits(n: int) -> bool:
        if trained is not None and n > trained:
            return False
        if available is None:
            return n == CTX_CHOICES[0]
        if scores_max is not None and any(n * n_batch * m.n_head * 4 > scores_max for m in models):
            return False
        return n * sum(m.kv_per_token for m in models) <= available * share

    return max((n for n in CTX_CHOICES if fits(n)), default=CTX_FLOOR)


@dataclass(frozen=True)
class Placement:
    """How many layers of each model are offloaded, and what that was decided on."""

    target: int
    """Target layers offloaded (n_gpu_layers)."""
    target_of: int
    """The target's layers as llama.cpp counts them (repeating ones + output)."""
    draft: int = 0
    draft_of: int = 0
    devices: tuple[str, ...] = ()
    """The GPUs counted (llama.cpp's names: CUDA0, Vulkan0, ...); none: no GPU."""
    free: int = 0
    """Bytes of GPU memory counted as usable (free, capped, less the margin)."""
    used: int = 0
    """Bytes the placement is estimated to take there."""

    def describe(self) -> str:
        """For people: where the layers run."""
        if not self.devices:
            return "no GPU: the models run on the CPU"
        parts = [f"target {self.target}/{self.target_of} layers"]
        if self.draft_of:
            parts.append(f"draft {self.draft}/{self.draft_of}")
        return (f"{', '.join(self.devices)} ({self.free / MIB:,.0f} MiB usable): {', '.join(parts)} on the GPU "
                f"(about {self.used / MIB:,.0f} MiB)")


def place(devices: Sequence[DeviceMemory], target: ModelNeed, draft: ModelNeed | None = None, *,
          target_layers: int | None = None, draft_layers: int | None = None,
          margin: int = MARGIN_BYTES, cap: int | None = None) -> Placement:
    """Offloaded layers for `target` and `draft` on the GPUs among `devices`
    (the rule in this module's docstring). `target_layers`/`draft_layers`:
    the user's counts (-1: all), kept as given; `cap`: count at most this many
    bytes free on each GPU. Raises ModelLoadError for a count above a model's layers."""
    asked_target = _asked(target_layers, target, "target")
    asked_draft = _asked(draft_layers, draft, "draft") if draft else 0
    gpus = [d for d in devices if d.kind in OFFLOAD_KINDS]
    if not gpus:
        return Placement(asked_target or 0, target.n_layers, asked_draft or 0, draft.n_layers if draft else 0)
    budget = sum(max(0, min(d.free, cap if cap is not None else d.free) - margin) for d in gpus)
    need_draft = draft.bytes if draft else (lambda n: 0)
    t, d = asked_target, asked_draft
    if t is None and d is None:
        full_draft = draft.n_layers if draft else 0
        if target.bytes(target.n_layers) + need_draft(full_draft) <= budget:
            t, d = target.n_layers, full_draft
        elif need_draft(full_draft) <= budget:
            d = full_draft
            t = target.most_layers(budget - need_draft(d))
        else:
            t, d = target.most_layers(budget), 0
    elif t is None:
        t = target.most_layers(budget - need_draft(d))
    elif d is None:
        d = draft.most_layers(budget - target.bytes(t))
    return Placement(t, target.n_layers, d, draft.n_layers if draft else 0, tuple(g.name for g in gpus),
                     budget, target.bytes(t) + need_draft(d))


def _asked(n: int | None, need: ModelNeed, role: str) -> int | None:
    if n is None:
        return None
    if n < -1 or n > need.n_layers:
        raise ModelLoadError(f"{n} GPU layers asked for the {role}, which has {need.n_layers} "
                             f"({need.n_layers - 1} and the output layer): give 0 to {need.n_layers}, or -1 for all")
    return need.n_layers if n == -1 else n


def free_cap(environ: Mapping[str, str] = os.environ) -> int | None:
    """FREE_CAP_ENV in bytes, or None where it is not set."""
    text = environ.get(FREE_CAP_ENV, "").strip()
    if not text:
        return None
    try:
        mib = int(text)
    except ValueError:
        mib = -1
    if mib < 0:
        raise ValueError(f"{FREE_CAP_ENV}={text!r}: expected a whole number of MiB, 0 or more")
    return mib * MIB

"""What Engine.describe() returns: where the models run, as data. No llama.cpp
code is imported here, so every layer above (and the tests' fakes) can use it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LayerRun:
    """Consecutive layers held by one device (the output layer counts as one)."""

    device: str
    """llama.cpp's name for it: "CPU", "CUDA0", "RPC0"."""
    worker: str | None
    """The RPC worker's endpoint ("10.0.0.2:50052"), or None for a device of this machine."""
    layers: int


@dataclass(frozen=True)
class ModelInfo:
    """One loaded model: its file and where its layers run."""

    path: str
    desc: str
    """llama.cpp's one-line description of the model."""
    n_layer: int
    n_gpu_layers: int
    """Layers on a GPU, the output layer counting as one (n_layer + 1 is all)."""
    n_ctx: int
    exact: bool
    flash_attn: str
    """"on", "off" or "llama.cpp's choice"."""
    layers: tuple[LayerRun, ...]
    """In layer order."""
    huge_pages_mib: int = 0
    """Of the memory its load allocated, what is in huge pages (llama/hugepages.py)."""


@dataclass(frozen=True)
class EngineInfo:
    """The engine: backend, kernels, caches, and its models by role ("target", "draft")."""

    backend: str
    gpu_offload: bool
    """Whether this llama.cpp build offloads layers to a GPU of this machine."""
    exact: bool
    max_verify_batch: int | None
    """None until the exactness probe has run."""
    workers: tuple[str, ...]
    """The RPC workers' endpoints."""
    conversations: int
    """Conversations held in the KV caches at once."""
    cache_ram_mib: int
    cache_disk: str | None
    models: dict[str, ModelInfo]

    @property
    def target(self) -> ModelInfo:
        return self.models["target"]

    @property
    def draft(self) -> ModelInfo | None:
        return self.models.get("draft")

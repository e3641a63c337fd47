"""How the models are loaded, stated once: `LoadSettings`, the one type every
face fills (the CLI's model options are generated from it, the chat app keeps
one per conversation and in its defaults, `serve` fills one through the CLI)
and edgespec.load.load_engine takes.

LOAD_LIMITS gives each numeric setting its range, default and help, as
edgespec/limits.py's LIMITS does for the sampling options; SWITCHES the help of
the others. Light to import: the CLI builds its parser from it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import TYPE_CHECKING

from edgespec.limits import MAX_CTX, Limit
from edgespec.net import Split
from edgespec.placement import CTX_CHOICES, CTX_FLOOR, CTX_MEMORY_SHARE

if TYPE_CHECKING:
    from edgespec.engine.runtime import CacheSettings

MIN_CTX = 32
"""The smallest context. llama.cpp's batch is never larger than the context asked
for, and a verify pass (up to 17 tokens) and the draft model's 16-token
calibration must each fit in one batch; nor does any chat fit in fewer tokens."""

_CHOICES = ", ".join(f"{n:,}" for n in CTX_CHOICES)

LOAD_LIMITS = MappingProxyType({
    "n_ctx": Limit("context size", MIN_CTX, MAX_CTX, None,
                   f"tokens the context holds; default: the largest of {_CHOICES} that the models were trained for "
                   f"and whose KV caches take at most {CTX_MEMORY_SHARE:.0%} of the memory available, "
                   f"never less than {CTX_FLOOR:,}"),
    "n_threads": Limit("threads", 1, None, None, "CPU threads; default: all cores"),
    "n_gpu_layers": Limit("GPU layers (target)", -1, None, None,
                          "target layers on the GPU, or with RPC workers on the workers and GPUs; -1 = all; "
                          "default: as many as fit beside the draft, with RPC workers all"),
    "n_gpu_layers_draft": Limit("GPU layers (draft)", -1, None, None,
                                "draft layers on the GPU; -1 = all; default: all if they fit, without RPC workers"),
})
"""Per numeric LoadSettings field: its range, its default (None: chosen at load) and what it means."""

SWITCHES = MappingProxyType({
    "exact": "batch-invariant kernels for the target: greedy speculation then equals plain greedy decoding token "
             "for token (slower on some machines; verify batches capped at those measured exact)",
    "flash_attn": "flash attention (default auto: off where all layers run on the CPU, whose kernel for it is slower "
                  "deep in a conversation, unless the context is so long that the attention scores it does without "
                  "would take too much memory; elsewhere llama.cpp's choice)",
})
"""The help of the LoadSettings fields that are not numbers."""

FLASH_ATTN = MappingProxyType({"auto": None, "on": True, "off": False})
"""Flash attention's settings by name, as LoadSettings.flash_attn holds them."""


@dataclass(frozen=True)
class LoadSettings:
    """How to load the models: the same for every face. None: chosen when loading."""

    n_ctx: int | None = LOAD_LIMITS["n_ctx"].default
    """Context size in tokens; None: edgespec.placement.fit_context for the models and this machine."""
    n_threads: int | None = LOAD_LIMITS["n_threads"].default
    """CPU threads; None: all cores."""
    n_gpu_layers: int | None = LOAD_LIMITS["n_gpu_layers"].default
    """Target layers offloaded (-1: all); None: as many as fit (edgespec.placement), all with `rpc`."""
    n_gpu_layers_draft: int | None = LOAD_LIMITS["n_gpu_layers_draft"].default
    """Draft layers offloaded (-1: all); None: all if they fit."""
    exact: bool = False
    """ModelSettings.exact, for the target."""
    flash_attn: bool | None = FLASH_ATTN["auto"]
    """ModelSettings.flash_attn, for both models."""
    rpc: Split | None = None
    """RPC workers (and how to split the target over them); None: none."""
    cache: CacheSettings | None = None
    """Conversations held at once and their snapshots (load.kv_cache()); None: one, none kept."""

    def __post_init__(self) -> None:
        for name, limit in LOAD_LIMITS.items():
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                raise ValueError(f"{limit.label} must be a whole number, got {value!r}")
            limit.check(value)
        if self.exact and self.flash_attn is False:
            raise ValueError("exact kernels need flash attention (their Q8_0 KV cache): set it on or auto, not off")

    @property
    def flash_attn_name(self) -> str:
        """"auto", "on" or "off"."""
        return next(name for name, value in FLASH_ATTN.items() if value is self.flash_attn)

    def over(self, base: LoadSettings) -> LoadSettings:
        """`base` with what these settings give: their fields that are not at their
        defaults (the RPC split and the cache are not carried: the app takes those apart)."""
        default = LoadSettings()
        given = {name: getattr(self, name) for name in (*LOAD_LIMITS, *SWITCHES)
                 if getattr(self, name) != getattr(default, name)}
        return replace(base, **given)

    def hardware(self) -> LoadSettings:
        """These settings without the cache: what, when it changes, needs the models loaded again."""
        return replace(self, cache=None)

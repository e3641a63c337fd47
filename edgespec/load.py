"""Model names to a loaded Engine: how the CLI, the chat app, the server and the
benchmark all choose and load their models.

A face says how a name becomes a file (the CLI downloads, the app only finds
what is installed); the rule for which models run is here, once.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Callable

from edgespec.config import dirs
from edgespec.engine.runtime import CacheSettings, Engine, ModelSettings
from edgespec.errors import ModelFileError
from edgespec.net import Split
from edgespec.placement import ModelNeed, Placement, free_cap, place

log = logging.getLogger("edgespec.placement")


def load_engine(target: str | None, draft: str | None = None, *, pair: str | None = None, no_draft: bool = False,
                resolve: Callable[[str], str | Path], pair_models: Callable[[str], tuple[str, str | None]] | None = None,
                n_ctx: int = 4096, n_threads: int | None = None, n_gpu_layers: int | None = None,
                n_gpu_layers_draft: int | None = None, exact: bool = False, rpc: Split | None = None,
                flash_attn: bool | None = None, cache: CacheSettings | None = None) -> Engine:
    """Load `target` (and `draft`), or else the pair's target and draft (`draft`
    replaces the pair's; `no_draft`: none at all). `resolve` turns a name or path
    into a local file, `pair_models` a pair name into its (target, draft) names
    (default: `registry_pair`, from models.yaml).
    `n_gpu_layers`, `n_gpu_layers_draft`: layers offloaded (-1: all); None: as
    many as fit on this machine's GPUs (`placement`; none without a GPU).
    `rpc`: RPC workers for the target's n_gpu_layers (None: all of them; the draft stays local);
    `flash_attn`: ModelSettings.flash_attn, for both; `cache`: conversations held at
    once and their snapshots (`kv_cache()`; None: one, and none kept).

    Slow: call it from a worker. Raises ModelFileError (missing model, with how to
    get it), ModelLoadError, IncompatibleDraftError.
    """
    if target is None:
        if pair is None:
            raise ModelFileError("No model chosen: pass --pair NAME or --target PATH (see `edgespec models`)")
        target, pair_draft = (pair_models or registry_pair)(pair)
        draft = draft or pair_draft
    if no_draft:
        draft = None
    target_path = resolve(target)
    draft_path = resolve(draft) if draft else None
    if rpc is not None and n_gpu_layers is None:
        n_gpu_layers = -1  # workers are named to hold the target: every layer goes to them (and local GPUs)
    if rpc is None:
        found = placement(target_path, draft_path, n_gpu_layers=n_gpu_layers, n_gpu_layers_draft=n_gpu_layers_draft,
                          n_ctx=n_ctx, exact=exact)
        if found is not None:
            log.info("%s", found.describe())
            n_gpu_layers, n_gpu_layers_draft = found.target, found.draft
    return Engine.load(
        ModelSettings(target_path, n_gpu_layers=n_gpu_layers or 0, exact=exact, n_ctx=n_ctx, n_threads=n_threads,
                      rpc=rpc, flash_attn=flash_attn),
        ModelSettings(draft_path, n_gpu_layers=n_gpu_layers_draft or 0, n_ctx=n_ctx,
                      n_threads=n_threads, flash_attn=flash_attn) if draft_path else None,
        cache=cache,
    )


def registry_pair(name: str, *, registry=None) -> tuple[str, str | None]:
    """A registry pair's (or a lone model's) target and draft names (`registry`:
    models.yaml's, unless given)."""
    from edgespec.models.registry import load_registry

    pair = (registry or load_registry()).pair_or_model(name)
    return pair.target, pair.draft


def placement(target: str | Path, draft: str | Path | None = None, *, n_gpu_layers: int | None = None,
              n_gpu_layers_draft: int | None = None, n_ctx: int = 4096, exact: bool = False,
              devices=None) -> Placement | None:
    """The layers of `target` and `draft` to offload to this machine's GPUs
    (edgespec.placement.place; counts given are kept), or None where llama.cpp
    sees no GPU: then the models run on the CPU whatever is asked. `devices`:
    instead of llama.cpp's (edgespec.llama.rpc.offload_devices)."""
    if devices is None:
        from edgespec.llama.rpc import offload_devices

        devices = [d for _, d in offload_devices()]
    if not devices:
        return None
    # the context's KV cache type (runtime._Loaded: exact kernels take Q8_0)
    target_need = _need(target, n_ctx=n_ctx, kv_type="q8_0" if exact else "f16")
    draft_need = _need(draft, n_ctx=n_ctx, kv_type="f16") if draft else None
    return place(devices, target_need, draft_need, target_layers=n_gpu_layers, draft_layers=n_gpu_layers_draft,
                 cap=free_cap())


def _need(path: str | Path, *, n_ctx: int, kv_type: str) -> ModelNeed:
    from edgespec.models.gguf_header import read_tensor_sizes

    meta, sizes = read_tensor_sizes(path)
    return ModelNeed.from_gguf(meta, sizes, n_ctx=n_ctx, kv_type=kv_type)


def kv_cache(*, parallel: int | None = None, ram_mib: int | None = None, disk_mib: int | None = None) -> CacheSettings:
    """What every face keeps of the conversations it reads: CacheSettings' defaults
    for what is not given, disk snapshots under edgespec's cache folder (0 MiB:
    none), and what is measured of this machine there too (always)."""
    default = CacheSettings()
    disk_mib = default.disk_mib if disk_mib is None else disk_mib
    return CacheSettings(slots=parallel, ram_mib=default.ram_mib if ram_mib is None else ram_mib,
                         disk=dirs().cache / "kv" if disk_mib > 0 else None, disk_mib=disk_mib,
                         measured=dirs().cache / "measured")

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
from edgespec.limits import LIMITS
from edgespec.load_settings import LoadSettings
from edgespec.modes import DEFAULT_MODE
from edgespec.placement import MIB, ContextNeed, ModelNeed, Placement, fit_context, free_cap, place

log = logging.getLogger("edgespec.placement")


def load_engine(target: str | None, draft: str | None = None, *, pair: str | None = None, no_draft: bool = False,
                resolve: Callable[[str], str | Path], pair_models: Callable[[str], tuple[str, str | None]] | None = None,
                settings: LoadSettings | None = None) -> Engine:
    """Load `target` (and `draft`), or else the pair's target and draft (`draft`
    replaces the pair's; `no_draft`: none at all), as `settings` say (default:
    LoadSettings()). `resolve` turns a name or path into a local file,
    `pair_models` a pair name into its (target, draft) names (default:
    `registry_pair`, from models.yaml).
    What the settings leave to the load is chosen here: the context size
    (`context_size`), the layers offloaded (`placement`; none without a GPU; with
    RPC workers, all of the target's go to them).

    Slow: call it from a worker. Raises ModelFileError (missing model, with how to
    get it), ModelLoadError, IncompatibleDraftError.
    """
    s = settings or LoadSettings()
    if target is None:
        if pair is None:
            raise ModelFileError("No model chosen: pass --pair NAME or --target PATH (see `edgespec models`)")
        target, pair_draft = (pair_models or registry_pair)(pair)
        draft = draft or pair_draft
    if no_draft:
        draft = None
    target_path = resolve(target)
    draft_path = resolve(draft) if draft else None
    n_ctx = s.n_ctx or context_size(target_path, draft_path, exact=s.exact)
    n_gpu_layers, n_gpu_layers_draft = s.n_gpu_layers, s.n_gpu_layers_draft
    if s.rpc is not None and n_gpu_layers is None:
        n_gpu_layers = -1  # workers are named to hold the target: every layer goes to them (and local GPUs)
    if s.rpc is None:
        found = placement(target_path, draft_path, n_gpu_layers=n_gpu_layers, n_gpu_layers_draft=n_gpu_layers_draft,
                          n_ctx=n_ctx, exact=s.exact)
        if found is not None:
            log.info("%s", found.describe())
            n_gpu_layers, n_gpu_layers_draft = found.target, found.draft
    return Engine.load(
        ModelSettings(target_path, n_gpu_layers=n_gpu_layers or 0, exact=s.exact, n_ctx=n_ctx,
                      n_threads=s.n_threads, rpc=s.rpc, flash_attn=s.flash_attn),
        ModelSettings(draft_path, n_gpu_layers=n_gpu_layers_draft or 0, n_ctx=n_ctx,
                      n_threads=s.n_threads, flash_attn=s.flash_attn) if draft_path else None,
        cache=s.cache,
    )


def pair_decoding(name: str | None, *, registry=None) -> tuple[str, int]:
    """The mode and k a reply decodes with where the user names neither: those the
    pair `name` recommends in models.yaml (a lone model's: lookup), or without a
    pair (models named by file) DEFAULT_MODE and LIMITS' k."""
    if name is None:
        return DEFAULT_MODE, LIMITS["k"].default
    from edgespec.models.registry import load_registry

    pair = (registry or load_registry()).pair_or_model(name)
    return pair.mode, pair.k


def context_size(target: str | Path, draft: str | Path | None = None, *, exact: bool = False,
                 available: int | None = ...) -> int:
    """The context size for `target` and `draft` when none is given: fit_context on
    their GGUF headers and this machine's available memory (`available`: instead
    of edgespec.machine.available_memory()), keeping to the contexts at which the
    CPU's attention kernel chosen for this machine still holds."""
    from edgespec.engine.attention import CPU_SCORES_MAX_BYTES
    from edgespec.machine import available_memory
    from edgespec.models.gguf_header import read_tensor_sizes

    needs = [ContextNeed.from_gguf(read_tensor_sizes(path)[0], kv_type=kv_type)
             for path, kv_type in ((target, "q8_0" if exact else "f16"), (draft, "f16")) if path]
    memory = available_memory() if available is ... else available
    n_ctx = fit_context(needs, memory, scores_max=CPU_SCORES_MAX_BYTES)
    log.info("context size %d (models trained for %s; %s available)", n_ctx,
             "/".join(str(n.n_ctx_train or "?") for n in needs),
             f"{memory / MIB:,.0f} MiB" if memory else "memory unknown")
    return n_ctx


def registry_pair(name: str, *, registry=None) -> tuple[str, str | None]:
    """A registry pair's (or a lone model's) target and draft names (`registry`:
    models.yaml's, unless given)."""
    from edgespec.models.registry import load_registry

    pair = (registry or load_registry()).pair_or_model(name)
    return pair.target, pair.draft


def placement(target: str | Path, draft: str | Path | None = None, *, n_gpu_layers: int | None = None,
              n_gpu_layers_draft: int | None = None, n_ctx: int, exact: bool = False,
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


def kv_cache(*, parallel: int | None = None, ram_mib: int | None = None, disk_mib: int | None = None,
             pool_mib: int | None = None) -> CacheSettings:
    """What every face keeps of the conversations it reads: CacheSettings' defaults
    for what is not given, disk snapshots under edgespec's cache folder (0 MiB:
    none), what is measured of this machine there too (always), and the lookup
    pool there (0 MiB: off; its folder is named all the same, so that deleting a
    conversation reaches the pool files)."""
    default = CacheSettings()
    disk_mib = default.disk_mib if disk_mib is None else disk_mib
    return CacheSettings(slots=parallel, ram_mib=default.ram_mib if ram_mib is None else ram_mib,
                         disk=dirs().cache / "kv" if disk_mib > 0 else None, disk_mib=disk_mib,
                         measured=dirs().cache / "measured", pool=pool_folder(),
                         pool_mib=default.pool_mib if pool_mib is None else pool_mib)


def pool_folder() -> Path:
    """Where the lookup pool's files are (engine/pool.py), one per tokenizer."""
    return dirs().cache / "pool"

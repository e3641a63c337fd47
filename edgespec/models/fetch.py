"""Turn a model name, a pair name or a path into local GGUF files.

    resolve_model("qwen2.5-coder-7b-instruct-q4_k_m")  # downloads once, then the cached path
    resolve_model("~/models/my.gguf")                   # any local GGUF file works as is
    resolve_pair()                                      # the bundled offline default pair

Each source kind gets its file its own way (hub.py downloads, bundled.py
assembles or finds, derived.py makes); whichever way, the size and sha256 from
the registry are checked before a path is returned.
"""

from __future__ import annotations

import os
from collections.abc import Collection, Sequence
from pathlib import Path

from edgespec.errors import RegistryError
from edgespec.models.gguf_header import check_magic
from edgespec.models.progress import ProgressCallback
from edgespec.models.registry import (DEFAULT_PAIR, ModelEntry, PairEntry, Registry, is_path_like,
                                      load_registry)
from edgespec.models.source import Fetch

__all__ = ["resolve_model", "resolve_pair", "fetch", "pull", "installed_path", "available_offline", "remove",
           "shared_with", "kept_note", "is_path_like"]


def resolve_model(name_or_path: str, *, download: bool = True, progress: ProgressCallback | None = None,
                  registry: Registry | None = None) -> Path:
    """A local GGUF file for a registry name or a path.

    A path is checked to exist and be GGUF, and returned as is. A name is looked
    up in the registry, fetched if needed (download=False: never touch the
    network, raise if the file is not here yet) and verified.
    """
    if is_path_like(name_or_path):
        return check_magic(name_or_path)
    registry = registry or load_registry()
    return fetch(registry.model(name_or_path), download=download, progress=progress, registry=registry)


def resolve_pair(name: str | None = None, *, progress: ProgressCallback | None = None,
                 download: bool = True, registry: Registry | None = None
                 ) -> tuple[Path, Path | None, PairEntry]:
    """(target path, draft path or None, the pair) for a pair name (None: the default pair).

    A model name gives that model alone, as a pair without a draft."""
    registry = registry or load_registry()
    pair = registry.pair_or_model(name or DEFAULT_PAIR)
    target = fetch(registry.model(pair.target), download=download, progress=progress, registry=registry)
    draft = (fetch(registry.model(pair.draft), download=download, progress=progress, registry=registry)
             if pair.draft else None)
    return target, draft, pair


def fetch(entry: ModelEntry, *, download: bool = True, progress: ProgressCallback | None = None,
          registry: Registry | None = None) -> Path:
    """The entry's local file: downloaded, assembled, made or found, then verified."""
    def fetch_other(name: str) -> Path:
        reg = registry or load_registry()
        return fetch(reg.model(name), download=download, progress=progress, registry=reg)

    return entry.source.fetch(entry, Fetch(download=download, progress=progress, other=fetch_other))


def installed_path(entry: ModelEntry) -> Path | None:
    """The entry's local file if it is already here (no download, no assembly, no hashing)."""
    return entry.source.installed_path(entry)


def available_offline(entry: ModelEntry, registry: Registry | None = None) -> bool:
    """Whether fetch() would succeed without a network: installed, bundled parts
    present, or made from a model that is available offline."""
    def available_other(name: str) -> bool:
        reg = registry or load_registry()
        return available_offline(reg.model(name), reg)

    return entry.source.available_offline(entry, available_other=available_other)


def shared_with(entry: ModelEntry, *, registry: Registry | None = None, along: Collection[str] = ()) -> tuple[str, ...]:
    """The other registry models whose file, or unfinished download, is also this entry's
    (empty if it has neither here), leaving out those named in `along` (removed with it)."""
    files = _local_files(entry)
    if not files:
        return ()
    registry = registry or load_registry()
    return tuple(sorted(other.name for other in registry.models.values()
                        if other.name != entry.name and other.name not in along
                        and any(_same_file(path, theirs) for path in files for theirs in _local_files(other))))


def remove(entry: ModelEntry, *, registry: Registry | None = None, along: Collection[str] = ()) -> list[Path]:
    """Delete the entry's local file; returns what was deleted (empty if nothing was there).

    Two entries may name one file (an alias in the user's models.yaml): they are two names,
    not two copies, so removing one must leave the other working, as `ollama rm` of one tag
    keeps a blob another tag uses. Such a file is deleted only with all its entries (`along`:
    the entries removed with this one); otherwise RegistryError, before anything is deleted."""
    users = shared_with(entry, registry=registry, along=along)
    if users:
        raise RegistryError(f"{entry.name}: {kept_note(entry, users)}")
    return entry.source.remove(entry)


def kept_note(entry: ModelEntry, users: Sequence[str]) -> str:
    """What `rm` says of a file it keeps for other entries."""
    return (f"kept {' and '.join(map(str, _local_files(entry)))}: also used by {', '.join(users)} "
            f"(`edgespec rm {' '.join([entry.name, *users])}` deletes it)")


def _local_files(entry: ModelEntry) -> list[Path]:
    """What remove() would delete of the entry: its file and an unfinished download's .part
    (the sidecars of a .part go with it)."""
    return [path for path in (installed_path(entry), entry.source.partial_path(entry)) if path is not None]


def _same_file(path: Path, other: Path | None) -> bool:
    """Whether two paths reach one file (links into huggingface_hub's cache reach its blob)."""
    try:
        return other is not None and os.path.samefile(path, other)
    except OSError:  # gone meanwhile, or unreadable: not a file both use
        return False


def pull(name: str, *, progress: ProgressCallback | None = None,
         registry: Registry | None = None) -> list[tuple[ModelEntry, Path]]:
    """Fetch a model, or both models of a pair; returns each entry with its file."""
    registry = registry or load_registry()
    return [(entry, fetch(entry, progress=progress, registry=registry)) for entry in registry.members(name)]


"""What the app needs from the model library, as one small interface.

`Library` lists the registry's pairs and models and pulls one; `RegistryLibrary`
is the real one (edgespec.models), tests pass a fake. `ModelChoice` says which
models the app runs, and `load_choice` loads it.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Protocol

from edgespec.models.progress import Progress, ProgressCallback


@dataclass(frozen=True)
class LibraryRow:
    """A pair or a model of the registry, as the models screen shows it."""

    name: str
    kind: str
    """"pair" or "model"."""
    installed: bool
    size: int | None
    """Bytes (for a pair: target + draft), None when unknown."""
    source: str
    """Where it comes from ("hf.co/owner/repo", "bundled, sha256 checked", a pair's models, ...)."""
    description: str = ""
    title: str = ""
    """The model's name and quantization ("Qwen2.5-Coder 1.5B Instruct Q4_K_M"); a pair's two joined by " + "."""


@dataclass(frozen=True)
class PullProgress:
    """Download progress, in the app's own terms."""

    done: int
    total: int | None
    speed: float | None = None
    """Bytes per second."""
    eta: float | None = None
    """Seconds left."""
    what: str = ""


def pull_progress(p: Progress) -> PullProgress:
    """A model file's progress (downloaded, assembled, requantized or verified) in the app's terms."""
    return PullProgress(done=p.done, total=p.total, speed=p.speed, eta=p.eta, what=f"{p.stage} {p.file}")


class PullCancelled(Exception):
    """The user cancelled a download."""


class Library(Protocol):
    def rows(self) -> list[LibraryRow]: ...

    def pull(self, name: str, *, progress: Callable[[PullProgress], None]) -> None:
        """Fetch a model (or both models of a pair); `progress` may raise PullCancelled."""

    def resolve(self, name: str, *, progress: ProgressCallback | None = None) -> str:
        """The local path of an installed model; raises ModelFileError (saying how to pull it) if absent.
        A bundled or derived model is assembled or made here the first time, reporting to `progress`."""

    def pair(self, name: str) -> tuple[str, str | None]:
        """A pair's (target, draft) model names."""

    def decoding(self, name: str) -> tuple[str, int]:
        """The mode and k a pair recommends (models.yaml): how replies decode where the settings name none."""


@dataclass(frozen=True)
class ModelChoice:
    """Which models to run: file paths or registry names, or a registry pair."""

    target: str | None = None
    draft: str | None = None
    pair: str | None = None
    no_draft: bool = False
    """The target alone, whatever the pair's draft."""

    @property
    def label(self) -> str:
        if self.pair:
            return self.pair + (" (no draft)" if self.no_draft else f" + {Path(self.draft).name}" if self.draft else "")
        names = [Path(p).name for p in (self.target, None if self.no_draft else self.draft) if p]
        return " + ".join(names)


def cancellable(progress: Callable[[PullProgress], None], cancel: threading.Event) -> Callable[[PullProgress], None]:
    """A progress callback that aborts the download (raises PullCancelled) once `cancel` is set."""

    def callback(p: PullProgress) -> None:
        if cancel.is_set():
            raise PullCancelled("download cancelled")
        progress(p)

    return callback


class RegistryLibrary:
    """The real library: models.yaml (edgespec.models.registry) and edgespec.models.fetch."""

    def __init__(self) -> None:
        from edgespec.models.registry import load_registry

        self.registry = load_registry()

    def rows(self) -> list[LibraryRow]:
        from edgespec.models import fetch
        from edgespec.models.catalog import source_words

        reg = self.registry
        installed = {name: fetch.available_offline(entry, reg) for name, entry in reg.models.items()}
        rows = []
        for name, pair in reg.pairs.items():
            members = [m for m in (pair.target, pair.draft) if m]
            sizes = [reg.models[m].display_size for m in members]
            rows.append(LibraryRow(
                name=name, kind="pair", installed=all(installed[m] for m in members),
                size=sum(sizes) if None not in sizes else None,
                source=" + ".join(members), description=pair.description,
                title=" + ".join(reg.models[m].display_name for m in members),
            ))
        for name, entry in reg.models.items():
            rows.append(LibraryRow(name=name, kind="model", installed=installed[name], size=entry.display_size,
                                   source=source_words(entry), description=entry.description,
                                   title=entry.display_name))
        return rows

    def pair(self, name: str) -> tuple[str, str | None]:
        from edgespec.load import registry_pair

        return registry_pair(name, registry=self.registry)

    def decoding(self, name: str) -> tuple[str, int]:
        from edgespec.load import pair_decoding

        return pair_decoding(name, registry=self.registry)

    def pull(self, name: str, *, progress: Callable[[PullProgress], None]) -> None:
        from edgespec.models.fetch import pull

        pull(name, progress=lambda p: progress(pull_progress(p)), registry=self.registry)

    def resolve(self, name: str, *, progress: ProgressCallback | None = None) -> str:
        from edgespec.models.fetch import resolve_model

        return str(resolve_model(name, download=False, progress=progress, registry=self.registry))


def load_choice(choice: ModelChoice, settings, *, library: Library | None = None,
                progress: ProgressCallback | None = None, cache=None, split=None):
    """Load the chosen models, installed ones only, with the settings' LoadSettings
    (see edgespec.load.load_engine; slow: call from a worker). `progress`
    hears of the files assembled, made or verified on the way (the first start of
    a bundled pair assembles and checks its files). `cache`: the engine's
    CacheSettings (default: edgespec.load.kv_cache(), snapshots kept on disk);
    `split`: the command line's Split, used while the settings name its workers."""
    from dataclasses import replace

    from edgespec.config import expand_home
    from edgespec.load import kv_cache, load_engine
    from edgespec.models.fetch import is_path_like

    def path_of(name: str) -> str:
        if is_path_like(name):
            return str(expand_home(name, what="model"))
        return (library or RegistryLibrary()).resolve(name, progress=progress)

    load = settings.load
    if split is not None and load.rpc is not None and tuple(split.workers) == tuple(load.rpc.workers):
        load = replace(load, rpc=split)
    return load_engine(choice.target, choice.draft, pair=choice.pair, no_draft=choice.no_draft,
                       resolve=path_of, pair_models=lambda name: (library or RegistryLibrary()).pair(name),
                       settings=replace(load, cache=cache or kv_cache()))

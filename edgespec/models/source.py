"""Where a model file comes from: the interface each source kind of models.yaml
implements (hub.py, bundled.py, derived.py), the states it reports, and the
entries of models.yaml that name a source (ModelEntry) or two models (PairEntry).
registry.py reads the file into them."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from edgespec.config import dirs
from edgespec.errors import RegistryError
from edgespec.limits import LIMITS
from edgespec.models.checksum import forget_verified
from edgespec.models.progress import ProgressCallback
from edgespec.modes import DEFAULT_MODE

# model states
READY = "ready"
"""The file is here."""
PARTS = "parts installed"
"""Bundled parts are installed; the file is assembled on first use (seconds, no network)."""
MISSING = "not installed"
"""A Python package must be installed first."""
REMOTE = "not downloaded"
"""On the hub; `edgespec pull` fetches it."""
MADE = "made on first use"
"""Made here from another model that is available offline (seconds, no network)."""


@dataclass(frozen=True)
class Fetch:
    """How an entry's file may be got: `download` (False: never touch the network),
    `progress` for what takes long, and `other(name)`, another registry model's
    file (what a made model is made from)."""

    download: bool
    progress: ProgressCallback | None
    other: Callable[[str], Path]


class Source(ABC):
    """One kind of `source` in models.yaml. Methods that may depend on another
    registry model (a file made from it) are given a function that answers the
    same question for a model name."""

    kind: str
    """Its `kind` in models.yaml."""
    offline_state: str = READY
    """The state of an entry that is not here yet but available_offline()."""

    @abstractmethod
    def describe(self) -> str:
        """Where the file comes from, in full (a hub repo and file, the packages of its parts)."""

    def origin(self) -> str:
        """Where the file comes from, in a few words: `edgespec models` and the app's library."""
        return self.describe()

    @abstractmethod
    def fetch(self, entry: ModelEntry, how: Fetch) -> Path:
        """The entry's local file: downloaded, assembled, made or found, then verified."""

    @abstractmethod
    def installed_path(self, entry: ModelEntry) -> Path | None:
        """The entry's local file if it is already here (no download, no assembly, no hashing)."""

    def partial_path(self, entry: ModelEntry) -> Path | None:
        """An unfinished download of the entry's file, if one is here (remove() deletes it)."""
        return None

    def available_offline(self, entry: ModelEntry, *, available_other: Callable[[str], bool]) -> bool:
        """Whether fetch() would succeed without a network."""
        return self.installed_path(entry) is not None

    @abstractmethod
    def missing(self, entry: ModelEntry, *, state_other: Callable[[str], tuple[str, str]]) -> tuple[str, str]:
        """(state, what to do to get it) for an entry that is not available offline."""

    def remove(self, entry: ModelEntry) -> list[Path]:
        """Delete the entry's local file; returns what was deleted (empty if nothing was there)."""
        path = self.installed_path(entry)
        return [] if path is None else [delete_in_models(path, entry)]


@dataclass(frozen=True)
class ModelEntry:
    """One model file and what is known about it."""

    name: str
    source: Source
    title: str | None = None
    """The model's name as people say it ("Qwen2.5-Coder 1.5B Instruct"), without the quantization."""
    description: str = ""
    params: str | None = None
    quant: str | None = None
    license: str | None = None
    context_length: int | None = None
    min_ram_gb: float | None = None
    vocab: str | None = None
    roles: tuple[str, ...] = ()
    size: int | None = None
    approx_size: int | None = None
    sha256: str | None = None
    unverified: bool = False

    @property
    def display_size(self) -> int | None:
        return self.size or self.approx_size

    @property
    def display_name(self) -> str:
        """The title and quantization ("Qwen2.5-Coder 1.5B Instruct Q4_K_M"), or the entry's name without a title."""
        if not self.title:
            return self.name
        return f"{self.title} {self.quant}" if self.quant else self.title


@dataclass(frozen=True)
class PairEntry:
    """A target and the draft that speeds it up."""

    name: str
    target: str
    draft: str | None
    mode: str = DEFAULT_MODE
    """The mode it decodes in where the user names none."""
    k: int = LIMITS["k"].default
    """The most tokens drafted per cycle where the user gives no k."""
    description: str = ""


def delete_in_models(path: Path, entry: ModelEntry) -> Path:
    """Delete `path`, a file of `entry` in the models folder (and what is known of its checksum)."""
    check_inside_models(path, entry)
    forget_verified(path)
    path.unlink()
    return path


def check_inside_models(path: Path, entry: ModelEntry) -> None:
    """rm deletes only in the models folder. models.yaml's file names are checked
    to stay inside it; this guards entries made in code (and links in the folder)."""
    models = dirs().models.resolve()
    if not path.parent.resolve().is_relative_to(models):
        raise RegistryError(f"{entry.name}: its file {path} is outside the models folder {models}; "
                            f"edgespec deletes only files it keeps there. Delete it yourself if you mean to.")

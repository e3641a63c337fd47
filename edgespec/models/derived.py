"""Models made on this machine from another one: a draft requantized by
llama.cpp's quantizer (kind `requantize` in models.yaml).

The bundled 0.5B draft keeps its output layer in Q8_0 and most weights in
Q5_0; requantized to Q4_0 it reads about two thirds of the bytes per token
and runs about a quarter faster on a CPU. The target checks every draft
token, so this changes speed only, never what is generated.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from edgespec.config import dirs
from edgespec.errors import DownloadError
from edgespec.models.bundled import remove_dead_temps, write_in_place
from edgespec.models.checksum import verify_file
from edgespec.models.gguf_header import check_magic
from edgespec.models.progress import Meter, ProgressCallback
from edgespec.models.source import MADE, Fetch, ModelEntry, Source


def derived_path(entry: ModelEntry, *, models_dir: Path | None = None) -> Path:
    """Where a requantized model lives (whether or not it exists yet)."""
    return (models_dir or dirs().models) / _source(entry).filename


def requantized(entry: ModelEntry, source_file: Callable[[], Path], *, models_dir: Path | None = None,
                progress: ProgressCallback | None = None) -> Path:
    """The entry's file, made first if it is not here from the model file that
    `source_file()` gets (assembled or downloaded as needed).

    Written through bundled.write_in_place, so an interrupted run leaves
    nothing that looks finished, and what a killed run left is cleared."""
    source = _source(entry)
    dest = derived_path(entry, models_dir=models_dir)
    fix = f"Remove it (`edgespec rm {entry.name}`); it is made again from {source.model} on next use."
    if dest.exists():
        remove_dead_temps(dest)
        return verify_file(dest, name=entry.name, size=entry.size, sha256=entry.sha256, progress=progress, fix=fix)
    from edgespec.llama.quantize import (
        quantize,  # the native library, only when there is work
    )

    made_from = source_file()
    size = entry.size or made_from.stat().st_size
    with write_in_place(dest, size=size, name=entry.name, doing="making") as tmp:
        meter = Meter(progress, dest.name, entry.size, stage="quantize")
        quantize(made_from, tmp, source.type)
        check_magic(tmp)
        made = tmp.stat().st_size
        if entry.size is not None and made != entry.size:
            raise DownloadError(f"{entry.name} made from {source.model} has {made} bytes, expected {entry.size}: "
                                f"this llama.cpp quantizes differently. Pass the draft you want as a path, "
                                f"or fix the entry's size in your models.yaml.")
        meter.update(made)
        meter.close()
    return dest


def _source(entry: ModelEntry) -> RequantizeSource:
    if not isinstance(entry.source, RequantizeSource):
        raise TypeError(f"{entry.name} is not made by requantizing")
    return entry.source


@dataclass(frozen=True)
class RequantizeSource(Source):
    """A file made on this machine from another registry model by llama.cpp's
    quantizer (seconds, no network): a cheaper draft for CPUs."""

    model: str
    """The registry model it is made from."""
    type: str
    """What it is quantized to (edgespec.llama.quantize.TYPES)."""
    filename: str
    """Its name in edgespec's models directory."""
    kind: str = field(default="requantize", init=False)
    offline_state = MADE

    def install_hint(self) -> str:
        return f"made from {self.model} on first use"

    def describe(self) -> str:
        return f"made here from {self.model} ({self.type.upper()})"

    def fetch(self, entry: ModelEntry, how: Fetch) -> Path:
        return requantized(entry, lambda: how.other(self.model), progress=how.progress)

    def installed_path(self, entry: ModelEntry) -> Path | None:
        path = derived_path(entry)
        return path if path.exists() else None

    def available_offline(self, entry: ModelEntry, *, available_other: Callable[[str], bool]) -> bool:
        return self.installed_path(entry) is not None or available_other(self.model)

    def missing(self, entry: ModelEntry, *, state_other: Callable[[str], tuple[str, str]]) -> tuple[str, str]:
        state, hint = state_other(self.model)
        return state, hint or f"edgespec pull {self.model}"


REQUANTIZE_TYPES = ("q4_0", "q8_0")
"""The keys of edgespec.llama.quantize.TYPES, named here so that reading models.yaml needs no native library."""

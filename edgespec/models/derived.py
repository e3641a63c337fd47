"""Models made on this machine from another one: a draft requantized by
llama.cpp's quantizer (kind `requantize` in models.yaml).

The bundled 0.5B draft keeps its output layer in Q8_0 and most weights in
Q5_0; requantized to Q4_0 it reads about two thirds of the bytes per token
and runs about a quarter faster on a CPU. The target checks every draft
token, so this changes speed only, never what is generated.
"""

from __future__ import annotations

import errno
import os
import tempfile
from pathlib import Path
from typing import Callable

from edgespec.config import dirs
from edgespec.errors import DownloadError
from edgespec.models.bundled import _check_space, _remove_stale_temps
from edgespec.models.gguf_header import check_magic
from edgespec.models.progress import Meter, ProgressCallback, human_bytes
from edgespec.models.registry import ModelEntry, RequantizeSource
from edgespec.models.verify import verify_file


def derived_path(entry: ModelEntry, *, models_dir: Path | None = None) -> Path:
    """Where a requantized model lives (whether or not it exists yet)."""
    return (models_dir or dirs().models) / _source(entry).filename


def requantized(entry: ModelEntry, source_file: Callable[[], Path], *, models_dir: Path | None = None,
                progress: ProgressCallback | None = None) -> Path:
    """The entry's file, made first if it is not here from the model file that
    `source_file()` gets (assembled or downloaded as needed).

    Written to a temporary file and renamed into place once complete, so an
    interrupted run leaves nothing that looks finished."""
    source = _source(entry)
    dest = derived_path(entry, models_dir=models_dir)
    fix = f"Remove it (`edgespec rm {entry.name}`); it is made again from {source.model} on next use."
    if dest.exists():
        return verify_file(dest, name=entry.name, size=entry.size, sha256=entry.sha256, progress=progress, fix=fix)
    from edgespec.llama.quantize import quantize  # the native library, only when there is work

    made_from = source_file()
    dest.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_temps(dest)
    _check_space(dest.parent, entry.size or made_from.stat().st_size, entry.name)
    fd, tmp_name = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".tmp")
    os.close(fd)
    tmp = Path(tmp_name)
    meter = Meter(progress, dest.name, entry.size, stage="quantize")
    try:
        quantize(made_from, tmp, source.type)
        check_magic(tmp)
        size = tmp.stat().st_size
        if entry.size is not None and size != entry.size:
            raise DownloadError(f"{entry.name} made from {source.model} has {size} bytes, expected {entry.size}: "
                                f"this llama.cpp quantizes differently. Pass the draft you want as a path, "
                                f"or fix the entry's size in your models.yaml.")
        meter.update(size - meter.done)
        meter.close()
        os.replace(tmp, dest)
    except OSError as e:
        if e.errno == errno.ENOSPC:
            raise DownloadError(f"the disk holding {dest.parent} filled up while making {entry.name} "
                                f"({human_bytes(entry.size)}); free some space and try again.") from e
        raise
    finally:
        tmp.unlink(missing_ok=True)
    return dest


def _source(entry: ModelEntry) -> RequantizeSource:
    if not isinstance(entry.source, RequantizeSource):
        raise TypeError(f"{entry.name} is not made by requantizing")
    return entry.source

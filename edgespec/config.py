"""Where edgespec keeps its files.

The platform's conventions (platformdirs) by default; the environment variable
EDGESPEC_HOME puts everything under one directory instead (tests, portable
installs, a USB stick).
"""

from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import IO, BinaryIO

import platformdirs

from edgespec.errors import EdgespecError

APP_NAME = "edgespec"
HOME_ENV = "EDGESPEC_HOME"
"""Environment variable: one base directory for config, data, models and caches."""


@dataclass(frozen=True)
class Dirs:
    """edgespec's directories (not created until something is written there)."""

    config: Path
    """User settings and the user's own models.yaml."""
    data: Path
    """Chat history and other state worth keeping."""
    models: Path
    """Model files: the bundled pair, assembled here, and hub downloads (resumable .part files)."""
    cache: Path
    """Things that can be rebuilt (verification markers)."""
    hub_cache: Path | None
    """Hugging Face cache, where files fetched before are found; None means huggingface_hub's own default."""

    @property
    def user_registry(self) -> Path:
        """The user's models.yaml, whose entries override the shipped ones."""
        return self.config / "models.yaml"


def expand_home(path: str | Path, *, what: str) -> Path:
    """`path` with a leading ~ or ~USER expanded; EdgespecError naming `what` (the option or
    variable that gave it) where there is no such home folder, which Path.expanduser raises
    as a bare RuntimeError."""
    try:
        return Path(path).expanduser()
    except RuntimeError:
        raise EdgespecError(f"{what} {path}: {str(path).split('/')[0]} names no home folder on this machine "
                            f"(no such user, or HOME is not set)") from None


def dirs() -> Dirs:
    """The directories for this process, honouring EDGESPEC_HOME (a relative one is taken
    from the current folder: paths shown, and stored with conversations, must not depend
    on the folder a later command starts in)."""
    home = os.environ.get(HOME_ENV)
    if home:
        base = expand_home(home, what=HOME_ENV).absolute()
        return Dirs(
            config=base / "config",
            data=base / "data",
            models=base / "models",
            cache=base / "cache",
            hub_cache=base / "hub",
        )
    data = Path(platformdirs.user_data_dir(APP_NAME, appauthor=False))
    return Dirs(
        config=Path(platformdirs.user_config_dir(APP_NAME, appauthor=False)),
        data=data,
        models=data / "models",
        cache=Path(platformdirs.user_cache_dir(APP_NAME, appauthor=False)),
        hub_cache=None,
    )


def open_kept(path: Path) -> BinaryIO:
    """A file edgespec keeps between runs (a calibration, a marker, the lookup pool), opened for
    reading without blocking. Raises OSError where it cannot be opened or is not a regular file
    (a FIFO in its place would block the open until a writer came)."""
    f = open(os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0)), "rb")
    if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
        f.close()
        raise OSError(errno.EINVAL, "not a regular file", str(path))
    return f


def read_kept(path: Path, *, limit: int) -> bytes:
    """The bytes of a small kept file (open_kept). Raises OSError as open_kept does,
    ValueError where it holds more than `limit` bytes (edgespec never writes one that large)."""
    with open_kept(path) as f:
        size = os.fstat(f.fileno()).st_size
        if size > limit:
            raise ValueError(f"{path}: {size} bytes, more than the {limit} such a file holds")
        return f.read(limit + 1)


def try_lock(f: IO) -> bool | None:
    """Lock an open file for this process without waiting: True if locked, False if another
    process (or another open of the file) holds its lock, None where files cannot be locked
    (outside POSIX). The kernel lets go of a killed process's locks, so a lock held means
    its writer is alive."""
    try:
        import fcntl  # pylint: disable=import-outside-toplevel
    except ImportError:
        return None
    try:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True

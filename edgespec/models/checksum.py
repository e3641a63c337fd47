"""Check a model file's size and sha256, remembering good results.

Hashing a multi-GB file takes seconds, so a file that passed is recorded in a
marker (its path, size, mtime and digest) under edgespec's cache directory; the
next start trusts the marker while size and mtime are unchanged.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from pathlib import Path

from edgespec.config import dirs, read_kept
from edgespec.errors import DownloadError
from edgespec.models.progress import Meter, ProgressCallback, human_bytes

CHUNK = 8 << 20


def verify_file(path: Path, *, name: str, size: int | None, sha256: str | None,
                progress: ProgressCallback | None = None, fix: str = "") -> Path:
    """Raise DownloadError if `path` has the wrong size or digest; `fix` says what to do."""
    st = path.stat()
    if size is not None and st.st_size != size:
        raise DownloadError(
            f"{path} is {st.st_size} bytes but {name} should be {size} bytes ({human_bytes(size)}): "
            f"the file is truncated or not the expected one. {fix}".rstrip())
    if sha256 is None or _marker_matches(path, st, sha256):
        return path
    digest = file_sha256(path, progress=progress)
    if digest != sha256:
        raise DownloadError(
            f"{path} has sha256 {digest} but {name} should have {sha256}: the file is damaged "
            f"or not the expected one. {fix}".rstrip())
    record_verified(path, digest)
    return path


def file_sha256(path: Path, *, progress: ProgressCallback | None = None) -> str:
    h = hashlib.sha256()
    meter = Meter(progress, path.name, path.stat().st_size, stage="verify")
    with path.open("rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
            meter.update(len(chunk))
    meter.close()
    return h.hexdigest()


def record_verified(path: Path, sha256: str) -> None:
    """Remember that `path`, as it is now, has this digest (best effort)."""
    st = path.stat()
    marker = _marker_path(path)
    tmp = marker.with_name(f".{marker.name}.{os.getpid()}.tmp")
    try:
        marker.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps({"path": str(path.resolve()), "size": st.st_size,
                                   "mtime_ns": st.st_mtime_ns, "sha256": sha256}))
        os.replace(tmp, marker)  # whatever was in its place (a FIFO would block a write) is replaced whole
    except OSError:  # only a cache: the next start hashes again
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)


def forget_verified(path: Path) -> None:
    try:
        _marker_path(path).unlink()
    except OSError:
        pass


def _marker_matches(path: Path, st: os.stat_result, sha256: str) -> bool:
    """Whether a marker says `path`, as it is now, has `sha256`. The marker is a cache: one
    that cannot be read or is not a marker (truncated, another shape) only means hashing again."""
    try:
        data = json.loads(read_kept(_marker_path(path), limit=1 << 16))  # a few hundred bytes written
    except (OSError, ValueError, RecursionError):  # RecursionError: json's nesting limit
        return False
    return isinstance(data, dict) and (data.get("path") == str(path.resolve()) and data.get("size") == st.st_size
            and data.get("mtime_ns") == st.st_mtime_ns and data.get("sha256") == sha256)


def _marker_path(path: Path) -> Path:
    key = hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:20]
    return dirs().cache / "verified" / f"{key}.json"

"""Snapshots of KV sequences: what one model's cache held after reading some
tokens, kept so that those tokens are never read again.

A snapshot is the bytes of `llama_state_seq_get_data` with the tokens they
hold and the key of the model and cache settings they were made with. The
cache keeps them in RAM, least recently used out past a budget, and on disk
(between runs), least recently used out past a disk budget. A snapshot is only
used for the same key, for a prompt that starts with (part of) its tokens and
in a context that holds all of them. A file that is short, corrupt, forged or
for another key, or that llama.cpp refuses, is deleted with a line in the log
and the prompt is read: never an error. Every count a file states is checked
against its size before anything is read, and only regular files are opened.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import stat
import struct
import time
import zlib
from collections import OrderedDict
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, Callable, Iterator, Sequence

import numpy as np

log = logging.getLogger("edgespec.cache")

MAGIC = b"ESKVSNP1"
"""The first bytes of a snapshot file (the format's version is its last digit)."""
_HEADER = struct.Struct("<8sI")  # magic, length of the JSON header that follows
LEFT_OVER_S = 3600
"""A save's temporary file older than this was left by a process killed while writing it
(a save takes seconds): the next save deletes it, as it is outside the disk budget."""


def prefix_length(a: np.ndarray, b: np.ndarray) -> int:
    """How many leading tokens two arrays share."""
    n = min(a.size, b.size)
    differ = np.flatnonzero(a[:n] != b[:n])
    return int(differ[0]) if differ.size else n


def file_identity(path: str | Path) -> str:
    """Which model file this is, by content rather than name: its size, its
    modification time and the hash of its first and last 8 MiB (a GGUF's header
    and tensor index are at the front, and any two quantizations differ there)."""
    path = Path(path)
    st = path.stat()
    h = hashlib.sha256(f"{st.st_size}:{st.st_mtime_ns}".encode())
    span = 8 << 20
    with open(path, "rb") as f:
        h.update(f.read(span))
        if st.st_size > 2 * span:
            f.seek(st.st_size - span)
            h.update(f.read(span))
    return h.hexdigest()


def cache_key(**settings) -> str:
    """The key of snapshots made with these settings (the model's identity and
    everything about its context that changes what its cache holds)."""
    return hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode()).hexdigest()[:32]


@dataclass(eq=False)
class Snapshot:
    key: str
    tokens: np.ndarray
    """The tokens the state holds (int32), in order from position 0."""
    data: bytes
    file: Path | None = field(default=None)
    """Its file, once written to disk or read from there (a snapshot is never
    changed, so it need not be written again)."""

    @property
    def nbytes(self) -> int:
        return len(self.data) + self.tokens.nbytes


@dataclass
class Found:
    snapshot: Snapshot
    shared: int
    """Tokens it shares with the prompt it was found for."""
    source: str
    """"ram" or "disk"."""


class SnapshotCache:
    """Snapshots in RAM (within `ram_bytes`) and, if `disk` is a folder, on disk
    (within `disk_bytes`). Shared by every model of an engine: the key tells
    their snapshots apart."""

    def __init__(self, *, ram_bytes: int, disk: str | Path | None = None, disk_bytes: int = 0):
        self.ram_bytes = max(0, int(ram_bytes))
        self.disk = Path(disk) if disk is not None and disk_bytes > 0 else None
        self.disk_bytes = max(0, int(disk_bytes))
        self._ram: OrderedDict[int, Snapshot] = OrderedDict()  # least recently used first
        self._index: dict[Path, tuple[str, np.ndarray, int]] = {}
        """Files seen on disk: key, tokens and size, read from their headers once."""

    # -- RAM --------------------------------------------------------------------------
    @property
    def ram_used(self) -> int:
        return sum(s.nbytes for s in self._ram.values())

    def snapshots(self) -> list[Snapshot]:
        """What RAM holds, least recently used first."""
        return list(self._ram.values())

    def keep(self, snapshot: Snapshot) -> bool:
        """Hold `snapshot` in RAM (a snapshot that another one extends is not kept
        twice); the least recently used go past the budget. False when it does not
        fit at all."""
        if snapshot.nbytes > self.ram_bytes:
            return False
        for sid, other in list(self._ram.items()):
            if other.key != snapshot.key:
                continue
            shared = prefix_length(other.tokens, snapshot.tokens)
            if shared == snapshot.tokens.size:  # holds no more than `other`
                self._ram.move_to_end(sid)
                return True
            if shared == other.tokens.size:  # `other` is a prefix of it
                del self._ram[sid]
        self._ram[id(snapshot)] = snapshot
        used = self.ram_used
        while used > self.ram_bytes:
            _, out = self._ram.popitem(last=False)
            used -= out.nbytes
        return True

    def clear(self) -> None:
        """Forget the RAM snapshots (disk ones stay)."""
        self._ram.clear()

    # -- finding ------------------------------------------------------------------------
    def find(self, key: str, tokens: Sequence[int], *, more_than: int, room: int | None = None) -> Found | None:
        """The snapshot for `key` that shares the longest prefix with `tokens`, if
        it shares more than `more_than` of them: from RAM, else from disk (loaded,
        checked and then held in RAM too). One of more than `room` tokens (the
        context's size) is passed over: it is kept for a larger context."""
        want = np.asarray(tokens, dtype=np.int32)

        def fits(held: np.ndarray) -> bool:
            return room is None or held.size <= room

        best: Found | None = None
        for sid, snap in self._ram.items():
            if snap.key == key and fits(snap.tokens):
                n = prefix_length(snap.tokens, want)
                if n > more_than and (best is None or n > best.shared):
                    best = Found(snap, n, "ram")
        if best is not None:
            self._ram.move_to_end(id(best.snapshot))
        floor = best.shared if best else more_than
        for path, n in self._disk_candidates(key, want, more_than=floor, fits=fits):
            snap = self._read(path, key)
            if snap is not None:
                self.keep(snap)
                return Found(snap, n, "disk")
        return best

    # -- disk -----------------------------------------------------------------------------
    def save(self, snapshot: Snapshot) -> bool:
        """Write `snapshot` to disk (atomically: a file is whole or absent), then
        drop the least recently used files past the budget. False, with a line in
        the log, when there is no disk cache or the write failed (a full disk
        loses the snapshot, nothing else)."""
        if self.disk is None or snapshot.nbytes > self.disk_bytes:
            return False
        if snapshot.file is not None:
            return True
        folder = self.disk / snapshot.key
        path = folder / (hashlib.sha256(snapshot.tokens.tobytes()).hexdigest()[:32] + ".kv")
        header = json.dumps({"key": snapshot.key, "n_tokens": int(snapshot.tokens.size),
                             "data_bytes": len(snapshot.data), "crc32": zlib.crc32(snapshot.data)}).encode()
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        try:
            folder.mkdir(parents=True, exist_ok=True)
            with open(tmp, "wb") as f:
                f.write(_HEADER.pack(MAGIC, len(header)))
                f.write(header)
                f.write(snapshot.tokens.astype("<i4").tobytes())
                f.write(snapshot.data)
                f.flush()
                os.fsync(f.fileno())
                size = f.tell()  # not stat() after the rename: another process may delete the file by then
            os.replace(tmp, path)
        except OSError as e:
            log.warning("could not write a KV snapshot to %s (%s); the conversation is kept, only "
                        "its cached reading is lost", folder, e.strerror or e)
            with suppress(OSError):  # (no folder to clean: a file in its place)
                tmp.unlink(missing_ok=True)
            return False
        snapshot.file = path
        self._index[path] = (snapshot.key, snapshot.tokens, size)
        self._trim_disk()
        return True

    def _files(self) -> list[Path]:
        if self.disk is None or not self.disk.is_dir():
            return []
        return [p for p in self.disk.glob("*/*.kv") if _is_file(p)]

    def drop(self, snapshot: Snapshot) -> None:
        """Forget `snapshot` in RAM and delete its file: llama.cpp refused it."""
        self._ram.pop(id(snapshot), None)
        if snapshot.file is not None:
            self._index.pop(snapshot.file, None)
            snapshot.file.unlink(missing_ok=True)
            snapshot.file = None

    def _disk_candidates(self, key: str, want: np.ndarray, *, more_than: int,
                         fits: Callable[[np.ndarray], bool]) -> list[tuple[Path, int]]:
        """Files for `key` whose tokens `fit` sharing more than `more_than` tokens
        with `want`, best first."""
        if self.disk is None:
            return []
        folder = self.disk / key
        found = []
        for path in folder.glob("*.kv") if folder.is_dir() else []:
            if not _is_file(path):  # not one this cache wrote (a folder, a FIFO, a link): left alone, unopened
                continue
            entry = self._index.get(path)
            if entry is None:
                entry = self._read_header(path)
                if entry is None:
                    continue
                self._index[path] = entry
            if entry[0] == key and fits(entry[1]):
                n = prefix_length(entry[1], want)
                if n > more_than:
                    found.append((path, n))
        return sorted(found, key=lambda f: -f[1])

    def _read_header(self, path: Path) -> tuple[str, np.ndarray, int] | None:
        """A file's key, tokens and size; None (and the file gone, with a line in
        the log) when it is not a whole snapshot."""
        try:
            with self._open(path) as (f, size):
                header, tokens = _header(f, size)
            return str(header["key"]), tokens, size
        except _NOT_A_SNAPSHOT as e:
            self._discard(path, e)
            return None

    def _read(self, path: Path, key: str) -> Snapshot | None:
        """The snapshot in `path`, checked whole (size, key, checksum), or None."""
        try:
            with self._open(path) as (f, size):
                header, tokens = _header(f, size)
                data = f.read(header["data_bytes"])  # bounded by the file's size in _header
            if header["key"] != key or len(data) != header["data_bytes"]:
                raise ValueError("truncated or not for this model")
            if zlib.crc32(data) != header["crc32"]:
                raise ValueError("checksum mismatch")
            os.utime(path)  # recently used: last out of the disk budget
            return Snapshot(key, tokens, data, file=path)
        except _NOT_A_SNAPSHOT as e:
            self._discard(path, e)
            return None

    @contextmanager
    def _open(self, path: Path) -> Iterator[tuple[BinaryIO, int]]:
        """`path` open for reading, and its size, if it may be a snapshot this cache
        wrote: no larger than the disk budget (save never writes past it)."""
        # never blocks (on a FIFO put there since it was listed) nor follows a link
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOFOLLOW", 0))
        with os.fdopen(fd, "rb") as f:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise ValueError("not a file")
            if st.st_size > self.disk_bytes:
                raise ValueError(f"{st.st_size} bytes, more than the disk budget")
            yield f, st.st_size

    def _discard(self, path: Path, why: BaseException) -> None:
        log.warning("ignoring KV snapshot %s (%s); it is deleted", path.name, why)
        self._index.pop(path, None)
        try:
            path.unlink()
        except OSError:
            pass

    def _trim_disk(self) -> None:
        self._remove_left_over()
        files = []
        for p in self._files():
            try:
                st = p.stat()
            except OSError:
                continue
            files.append((st.st_mtime, st.st_size, p))
        total = sum(size for _, size, _ in files)
        for _, size, p in sorted(files):
            if total <= self.disk_bytes:
                break
            try:
                p.unlink()
            except OSError:
                continue
            self._index.pop(p, None)
            total -= size


    def _remove_left_over(self) -> None:
        if self.disk is not None:
            remove_left_over(self.disk, "*/.*.kv.*.tmp")


def remove_left_over(folder: Path, pattern: str) -> None:
    """Delete the temporary files matching `pattern` in `folder` that saves killed while
    writing left (SIGKILL runs no cleanup): regular files older than LEFT_OVER_S."""
    if not folder.is_dir():
        return
    for p in folder.glob(pattern):
        try:
            if _is_file(p) and time.time() - p.lstat().st_mtime > LEFT_OVER_S:
                p.unlink()
        except OSError:
            continue


def _is_file(path: Path) -> bool:
    """Whether `path` itself (not what a link points to) is a regular file: only
    those are opened, so a FIFO never blocks a run."""
    try:
        return stat.S_ISREG(path.lstat().st_mode)
    except OSError:
        return False


_NOT_A_SNAPSHOT = (OSError, ValueError, KeyError, TypeError, RecursionError, struct.error)
"""What reading a file that is not a whole snapshot raises (RecursionError: json's
nesting limit)."""


def _header(f: BinaryIO, size: int) -> tuple[dict, np.ndarray]:
    """A snapshot file's JSON header and tokens, every count it states checked
    against the file's `size` before anything is read; the file is left at its
    state data."""
    magic, n = _HEADER.unpack(f.read(_HEADER.size))
    if magic != MAGIC or n > 4096:
        raise ValueError("not an edgespec KV snapshot")
    header = json.loads(f.read(n))
    if not isinstance(header, dict):
        raise ValueError("not an edgespec KV snapshot")
    count, data_bytes = _count(header, "n_tokens"), _count(header, "data_bytes")
    if _HEADER.size + n + 4 * count + data_bytes != size:
        raise ValueError(f"{size} bytes, not the length its header states")
    tokens = np.frombuffer(f.read(4 * count), dtype="<i4").astype(np.int32)
    if tokens.size != count:
        raise ValueError("truncated")
    return header, tokens


def _count(header: dict, name: str) -> int:
    value = header[name]
    if type(value) is not int or value < 0:
        raise ValueError(f"{name} is not a count")
    return value

"""The pool of earlier text kept between runs: a SuffixIndex per tokenizer, in
one file per vocabulary that the app and the server share.

`<folder>/<vocab id>.pool`, written atomically (a temporary file in the same
folder, then os.replace) under a file lock, merging what another process saved
in the meantime (load, merge, save). A document deleted here (`forget`) leaves
a tombstone in the file, so that another process that still holds it drops it
at its next save instead of writing it back. A file that is damaged, truncated,
from another vocabulary or another format version is not used, with a line in
the log, and is replaced at the next save; a failed save (a full disk) keeps
the old file, with a line in the log, and one killed while writing leaves a
temporary file that a later save deletes (snapshots.remove_left_over). Nothing
here raises for a file's sake.

The file: MAGIC, FORMAT and the header's length (struct _HEAD), the header
(JSON: vocabulary id, edgespec version, documents as [name, tokens, last used],
tombstones as [name, when]), every document's tokens (int32, little-endian, in
the header's order), then the CRC32 of all that precedes it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import re
import struct
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np
from filelock import FileLock, Timeout

from edgespec import __version__
from edgespec.config import open_kept
from edgespec.engine.snapshots import remove_left_over
from edgespec.engine.suffix import MAX_TOKEN, SuffixIndex
from edgespec.models.compat import VocabInfo

log = logging.getLogger("edgespec.cache")

MAGIC = b"ESPOOL\r\n"
FORMAT = 1
"""The file format's version; a file with another is not read (and is replaced at the next save)."""
_HEAD = struct.Struct("<8sII")
"""MAGIC, FORMAT, the header's length in bytes."""
_CRC = struct.Struct("<I")
LOCK_TIMEOUT_S = 10.0
"""How long a save waits for another process's save before giving up (with a log line)."""
MAX_TOMBSTONES = 4096
"""Deleted documents remembered in the file, newest first: enough for any process still holding one."""
_VOCAB_ID = re.compile(r"[0-9a-f]{8,64}")


def vocab_id(vocab: VocabInfo) -> str:
    """The tokenizer's identity: a hash of its kind and every token's text by id. Token
    ids mean the same text exactly when it is equal, whichever model file they come
    from (read from a GGUF header or a loaded model alike)."""
    text = json.dumps([vocab.vocab_type, list(vocab.tokens)])  # ASCII: unambiguous bytes
    return hashlib.sha256(text.encode("ascii")).hexdigest()[:32]


class _Unusable(Exception):
    """A pool file that cannot be used: damaged, truncated, or written for something else."""


@dataclass
class _Stored:
    """What a pool file holds."""

    documents: list[tuple[str, float, np.ndarray]] = field(default_factory=list)
    """(name, last used, tokens), in the file's order."""
    tombstones: dict[str, float] = field(default_factory=dict)
    """Deleted document -> when."""

    def drop_outside(self, vocab_size: int) -> list[str]:
        """Drop the documents holding a token id from `vocab_size` on; their names."""
        outside = [name for name, _, tokens in self.documents if tokens.size and int(tokens.max()) >= vocab_size]
        self.documents = [d for d in self.documents if d[0] not in outside]
        return outside


class Pool:
    """Earlier text for one tokenizer, matched through `index`, kept in `path`.
    One thread at a time uses a Pool (the engine's); processes share its file."""

    def __init__(self, path: Path, vocab: str, index: SuffixIndex, tombstones: dict[str, float]):
        self.path = path
        self.vocab_id = vocab
        self.index = index
        self._tombstones = tombstones
        self._changed = False
        self._lock = FileLock(path.with_name(path.name + ".lock"), thread_local=False)

    @classmethod
    def open(cls, folder: Path, vocab: str, *, budget_bytes: int | None = None,
             vocab_size: int | None = None) -> Pool:
        """The pool for vocabulary `vocab` (vocab_id()) of `vocab_size` tokens kept in `folder`,
        holding at most `budget_bytes` (None: no limit); empty where there is no usable
        file yet. A document holding an id from `vocab_size` on is left out. The
        file keeps what the budget of the last process to save it kept: a pool that is
        turned off is not opened (forget_everywhere still reaches its files)."""
        if not _VOCAB_ID.fullmatch(vocab):
            raise ValueError(f"a vocabulary id is 8-64 lowercase hex digits, not {vocab!r}")
        folder = Path(folder)
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            log.warning("cannot create the lookup pool's folder %s (%s); the pool is kept in memory only",
                        folder, e.strerror or e)
        path = folder / f"{vocab}.pool"
        stored = _read(path, vocab, vocab_size) or _Stored()
        index = SuffixIndex(budget_bytes=budget_bytes, vocab_size=vocab_size)
        for name, when, tokens in sorted(stored.documents, key=lambda d: d[1]):  # the newest evict the oldest
            index.add(name, tokens, last_used=when)
        return cls(path, vocab, index, stored.tombstones)

    def add(self, doc: str, tokens: Sequence[int] | np.ndarray) -> list[str]:
        """Hold `tokens` as document `doc` (replacing its earlier tokens); kept at the
        next save. Returns the documents evicted to stay within the budget."""
        self._changed = True
        return self.index.add(doc, tokens)

    def extend(self, doc: str, tokens: Sequence[int] | np.ndarray) -> list[str]:
        """Add `tokens` at the end of document `doc` (SuffixIndex.extend); kept at the next save."""
        self._changed = True
        return self.index.extend(doc, tokens)

    def touch(self, doc: str) -> None:
        """`doc` was used now: the last to be evicted."""
        if doc in self.index:
            self._changed = True
            self.index.touch(doc)

    def forget(self, doc: str) -> bool:
        """Remove `doc` here and from the file (and from other processes' pools at their
        next save). False, with a line in the log, where the file could not be written;
        the next save tries again."""
        self.index.remove(doc)
        self._tombstones[doc] = time.time()
        self._changed = True
        return self.save()

    def save(self) -> bool:
        """Merge what the file holds now (another process's documents and deletions)
        and write the result. True when the file holds this pool (or nothing changed)."""
        if not self._changed:
            return True
        try:
            self._lock.acquire(timeout=LOCK_TIMEOUT_S)
        except Timeout:
            log.warning("the lookup pool %s stayed locked by another process for %.0f s; not saved this time",
                        self.path, LOCK_TIMEOUT_S)
            return False
        except OSError as e:
            log.warning("cannot lock the lookup pool %s (%s); not saved", self.path, e.strerror or e)
            return False
        try:
            stored = _read(self.path, self.vocab_id, self.index.vocab_size)
            if stored is not None:
                self._merge(stored)
            remove_left_over(self.path.parent, ".*.pool.*.tmp")
            if not _write(self.path, self._contents()):
                return False
            self._changed = False
            return True
        finally:
            self._lock.release()

    def _merge(self, stored: _Stored) -> None:
        for name, when in stored.tombstones.items():
            self._tombstones[name] = max(when, self._tombstones.get(name, when))
        for name, when, tokens in stored.documents:
            deleted = self._tombstones.get(name)
            newer_here = name in self.index and self.index.last_used(name) >= when
            if not newer_here and (deleted is None or when > deleted):
                self.index.add(name, tokens, last_used=when)
        for name, deleted in self._tombstones.items():
            if name in self.index and self.index.last_used(name) <= deleted:
                self.index.remove(name)
        newest = sorted(self._tombstones.items(), key=lambda nw: nw[1], reverse=True)[:MAX_TOMBSTONES]
        self._tombstones = dict(newest)

    def _contents(self) -> bytes:
        names = self.index.documents()
        tokens = [self.index.tokens(name) for name in names]
        header = json.dumps({
            "vocab": self.vocab_id,
            "edgespec": __version__,
            "documents": [[name, len(t), self.index.last_used(name)] for name, t in zip(names, tokens)],
            "tombstones": [[name, when] for name, when in self._tombstones.items()],
        }).encode()
        parts = [_HEAD.pack(MAGIC, FORMAT, len(header)), header]
        parts += [t.astype("<i4").tobytes() for t in tokens]
        body = b"".join(parts)
        return body + _CRC.pack(zlib.crc32(body))


def forget_everywhere(folder: Path, doc: str) -> bool:
    """Remove `doc` from every pool file in `folder`, whatever its vocabulary: a
    deleted conversation may have been remembered under several models, and the
    pool may be turned off now. False, with a line in the log, where a file could
    not be written."""
    saved = True
    for path in sorted(Path(folder).glob("*.pool")):
        if _VOCAB_ID.fullmatch(path.stem):
            # a tombstone even where the file lacks it: another process may hold it unsaved
            saved = Pool.open(folder, path.stem).forget(doc) and saved
    return saved


def _write(path: Path, data: bytes) -> bool:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        log.warning("could not save the lookup pool to %s (%s); the file keeps its earlier contents",
                    path, e.strerror or e)
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass
        return False
    return True


def _read(path: Path, vocab: str, vocab_size: int | None = None) -> _Stored | None:
    """The file's contents, but the documents holding an id from `vocab_size` on; None
    where there is none or it cannot be used (with a log line)."""
    try:
        with open_kept(path) as f:  # never blocks: a FIFO in the file's place is refused, not waited on
            stored = _parse(f.read(_HEAD.size), f, os.fstat(f.fileno()).st_size, vocab)
        outside = stored.drop_outside(vocab_size) if vocab_size is not None else []
        if outside:
            log.warning("left out %d documents of the lookup pool %s: they hold token ids outside the vocabulary",
                        len(outside), path)
        return stored
    except FileNotFoundError:
        return None
    except _Unusable as e:
        log.warning("not using the lookup pool %s: %s; it will be replaced", path, e)
    except OSError as e:
        log.warning("cannot read the lookup pool %s (%s); starting without it", path, e.strerror or e)
    return None


def _parse(head: bytes, f: Any, size: int, vocab: str) -> _Stored:
    if len(head) < _HEAD.size:
        raise _Unusable("it is truncated")
    magic, version, header_len = _HEAD.unpack(head)
    if magic != MAGIC:
        raise _Unusable("it is not a pool file")
    if version != FORMAT:
        raise _Unusable(f"it has format {version}, this edgespec reads {FORMAT}")
    token_bytes = size - _HEAD.size - header_len - _CRC.size
    if token_bytes < 0:
        raise _Unusable("it is truncated")
    header_bytes = f.read(header_len)
    try:
        header = json.loads(header_bytes)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):  # RecursionError: json's nesting limit
        raise _Unusable("its header is damaged") from None
    if not isinstance(header, dict):
        raise _Unusable("its header is damaged")
    if header.get("vocab") != vocab:
        raise _Unusable("it was built with another vocabulary")
    documents = _entries(header.get("documents"), 3)
    tombstones = _entries(header.get("tombstones"), 2)
    lengths = [n for _, n, _ in documents]
    if not all(isinstance(n, int) and n >= 0 for n in lengths) or 4 * sum(lengths) != token_bytes:
        raise _Unusable("it is truncated or its header is damaged")
    data = f.read(token_bytes)
    crc = f.read(_CRC.size)
    if len(data) != token_bytes or len(crc) != _CRC.size:
        raise _Unusable("it is truncated")
    if _CRC.unpack(crc)[0] != zlib.crc32(data, zlib.crc32(header_bytes, zlib.crc32(head))):
        raise _Unusable("its checksum does not match")
    tokens = np.frombuffer(data, dtype="<i4").astype(np.int32)
    if tokens.size and (int(tokens.min()) < 0 or int(tokens.max()) > MAX_TOKEN):
        raise _Unusable("it holds impossible token ids")
    stored = _Stored(tombstones={name: when for name, when in tombstones})
    offset = 0
    for (name, n, when) in documents:
        stored.documents.append((name, when, tokens[offset:offset + n]))
        offset += n
    return stored


def _entries(value: Any, width: int) -> list[list]:
    """A header's list of [name, ..., time] rows, checked."""
    if not isinstance(value, list) or not all(
            isinstance(row, list) and len(row) == width and isinstance(row[0], str)
            and isinstance(row[-1], (int, float)) and math.isfinite(row[-1]) for row in value):
        raise _Unusable("its header is damaged")
    return value

"""Conversations on disk: SQLite (stdlib sqlite3, WAL mode), one file in the data directory.

Every write is one transaction, so a crash or a kill loses at most the write
in flight: a reply row is created as "interrupted" when generation starts and
updated as it streams, and only marked "done" or "stopped" at the end.

The schema is versioned with `PRAGMA user_version`: MIGRATIONS[i] takes a
database from version i to i + 1, in its own transaction.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterable, Iterator

from edgespec.chat.attachments import Attachment
from edgespec.engine.events import Stats
from edgespec.errors import EdgespecError, one_line

ROLES = ("system", "user", "assistant")
STATUSES = ("done", "stopped", "interrupted", "error")
TITLE_MAX = 200
"""The longest title kept, in characters: an imported or renamed one is cut there."""

MIGRATIONS: tuple[str, ...] = (
    # 1: conversations (with the model pair and settings used, as JSON) and their messages.
    """
    CREATE TABLE conversations (
        id       INTEGER PRIMARY KEY AUTOINCREMENT,
        title    TEXT NOT NULL,
        created  REAL NOT NULL,
        updated  REAL NOT NULL,
        settings TEXT NOT NULL DEFAULT '{}'
    );
    CREATE TABLE messages (
        id              INTEGER PRIMARY KEY AUTOINCREMENT,
        conversation_id INTEGER NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
        role            TEXT NOT NULL CHECK (role IN ('system', 'user', 'assistant')),
        content         TEXT NOT NULL,
        status          TEXT NOT NULL DEFAULT 'done',
        stats           TEXT,
        from_draft      TEXT,
        created         REAL NOT NULL
    );
    CREATE INDEX messages_by_conversation ON messages (conversation_id, id);
    """,
    # 2: files attached to messages (chat/attachments.py), each version kept whole.
    """
    CREATE TABLE attachments (
        id         INTEGER PRIMARY KEY AUTOINCREMENT,
        message_id INTEGER NOT NULL REFERENCES messages(id) ON DELETE CASCADE,
        path       TEXT NOT NULL,
        content    TEXT NOT NULL,
        sha256     TEXT NOT NULL,
        added      REAL NOT NULL,
        origin     TEXT NOT NULL DEFAULT 'attached'
    );
    CREATE INDEX attachments_by_message ON attachments (message_id, id);
    """,
)


class StoreError(EdgespecError):
    """The conversation store cannot do what was asked (unknown id, bad import, newer schema)."""


@dataclass
class Message:
    role: str
    """"system" | "user" | "assistant"."""
    content: str
    id: int | None = None
    stats: Stats | None = None
    """An assistant reply's statistics (stored as Stats.to_dict(), read back as Stats)."""
    from_draft: list[bool] | None = None
    """Per generated token: True when it was an accepted draft token."""
    status: str = "done"
    """"done" | "stopped" | "interrupted" | "error"."""
    attachments: list[Attachment] = field(default_factory=list)
    """Files this message carries (chat/attachments.py), in order."""


@dataclass
class ConversationInfo:
    id: int
    title: str
    created: datetime
    updated: datetime
    n_messages: int


def clean_title(title: str) -> str:
    """`title` as one line of plain text, fit for a terminal (errors.one_line), at most
    TITLE_MAX characters. Titles are stored so; faces show stored ones through it too
    (older rows were not)."""
    return one_line(title, TITLE_MAX)


def default_path() -> Path:
    from edgespec.config import dirs

    return dirs().data / "conversations.db"


class ConversationStore:
    """Conversations and their messages. Safe to share between threads."""

    def __init__(self, path: str | Path | None = None):
        """Open (or create) the store. A damaged file is never deleted: it is moved
        aside under a dated name and a fresh one started (see `notice`). Raises
        StoreError, naming the file and what to do, when it cannot be opened."""
        self.path = Path(path) if path is not None else default_path()
        self._lock = threading.RLock()
        self.moved_aside: Path | None = None
        """Where a damaged database found at `path` was moved to, if one was."""
        self.notice = ""
        """What the faces should tell the user about opening the store (a damaged file moved aside)."""
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise StoreError(f"Cannot create the folder of {self.path}: {e.strerror or e}. Make it writable, or "
                             f"set EDGESPEC_HOME to a folder you can write.") from None
        try:
            self._db = self._open()
        except sqlite3.DatabaseError as e:
            if getattr(e, "sqlite_errorcode", None) not in (SQLITE_CORRUPT, SQLITE_NOTADB):
                raise _store_error(self.path, e) from e
            self.moved_aside = self._move_aside()
            self.notice = (f"{self.path} was damaged ({e}); it was kept as {self.moved_aside} and a fresh one "
                           "started. `sqlite3 OLD .recover | sqlite3 NEW` may salvage its conversations.")
            try:
                self._db = self._open()
            except sqlite3.Error as e2:
                raise _store_error(self.path, e2) from e2

    def _open(self) -> sqlite3.Connection:
        """Connect, check the file is sound (quick_check: one read of every page) and migrate."""
        db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False, timeout=10)
        try:
            db.execute("PRAGMA journal_mode = WAL")
            db.execute("PRAGMA synchronous = NORMAL")  # in WAL mode: durable across app crashes
            db.execute("PRAGMA foreign_keys = ON")
            db.create_function("folded_contains", 2, _folded_contains, deterministic=True)
            problems = db.execute("PRAGMA quick_check(1)").fetchone()[0]
            if problems != "ok":
                error = sqlite3.DatabaseError(f"integrity check: {problems}")
                error.sqlite_errorcode = SQLITE_CORRUPT
                raise error
            self._db = db
            self._migrate()
        except BaseException:
            db.close()
            raise
        return db

    def _move_aside(self) -> Path:
        """Rename the damaged database (and its WAL files) to `<name>.damaged-<date>`."""
        aside = self.path.with_name(f"{self.path.name}.damaged-{datetime.now():%Y%m%d-%H%M%S}")
        try:
            for suffix in ("", "-wal", "-shm"):
                part = self.path.with_name(self.path.name + suffix)
                if part.exists():
                    part.rename(aside.with_name(aside.name + suffix))
        except OSError as e:
            raise StoreError(f"{self.path} is damaged and could not be moved aside ({e.strerror or e}). Move it "
                             f"away yourself (keep it: `sqlite3 FILE .recover` may salvage it) and start "
                             f"again.") from None
        return aside

    # -- conversations -----------------------------------------------------------------
    def create(self, *, title: str = "New chat", settings: dict | None = None, messages: Iterable[Message] = (),
               created: float | None = None, updated: float | None = None) -> int:
        """A new conversation, with `messages` if given, in one transaction; returns its id.
        `created` and `updated` (Unix times) default to now and to `created`."""
        created = time.time() if created is None else created
        updated = created if updated is None else updated
        with self._tx() as db:
            cur = db.execute(
                "INSERT INTO conversations (title, created, updated, settings) VALUES (?, ?, ?, ?)",
                (clean_title(title), created, updated, _dumps(settings or {})),
            )
            for m in messages:
                row = db.execute(
                    "INSERT INTO messages (conversation_id, role, content, status, stats, from_draft, created) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?)",
                    (cur.lastrowid, m.role, m.content, m.status, *_message_extras(m), updated))
                _insert_attachments(db, row.lastrowid, m.attachments)
            return cur.lastrowid

    def list(self, *, search: str | None = None) -> list[ConversationInfo]:
        """Conversations, most recently updated first; `search` matches titles and message text."""
        sql = _INFO_SQL
        args: tuple = ()
        if search:
            sql += (" WHERE folded_contains(c.title, ?1) OR EXISTS (SELECT 1 FROM messages m "
                    "WHERE m.conversation_id = c.id AND folded_contains(m.content, ?1))")
            args = (search.casefold(),)
        with self._reading() as db:
            rows = db.execute(sql + " ORDER BY c.updated DESC, c.id DESC", args).fetchall()
        return [_info(row) for row in rows]

    def info(self, conversation_id: int) -> ConversationInfo:
        """The conversation's title, times and length; StoreError when there is no such conversation."""
        with self._reading() as db:
            self._require(db, conversation_id)
            return _info(db.execute(_INFO_SQL + " WHERE c.id = ?", (conversation_id,)).fetchone())

    def title(self, conversation_id: int) -> str | None:
        """The conversation's title; None when there is no such conversation."""
        if not _storable(conversation_id):
            return None
        with self._reading() as db:
            row = db.execute("SELECT title FROM conversations WHERE id = ?", (conversation_id,)).fetchone()
        return row[0] if row else None

    def latest(self) -> int | None:
        """The most recently updated conversation's id, or None when there is none."""
        with self._reading() as db:
            row = db.execute("SELECT id FROM conversations ORDER BY updated DESC, id DESC LIMIT 1").fetchone()
        return row[0] if row else None

    def rename(self, conversation_id: int, title: str) -> None:
        with self._tx() as db:
            self._require(db, conversation_id)
            db.execute("UPDATE conversations SET title = ? WHERE id = ?", (clean_title(title), conversation_id))

    def delete(self, conversation_id: int) -> None:
        with self._tx() as db:
            self._require(db, conversation_id)
            db.execute("DELETE FROM conversations WHERE id = ?", (conversation_id,))

    def settings(self, conversation_id: int) -> dict:
        with self._reading() as db:
            settings = json.loads(self._require(db, conversation_id)[4])
        return settings if isinstance(settings, dict) else {}  # settings are an object; any other JSON reads as none

    def save_settings(self, conversation_id: int, settings: dict) -> None:
        with self._tx() as db:
            self._require(db, conversation_id)
            db.execute("UPDATE conversations SET settings = ? WHERE id = ?", (_dumps(settings), conversation_id))

    # -- messages ----------------------------------------------------------------------
    def messages(self, conversation_id: int) -> list[Message]:
        with self._reading() as db:
            self._require(db, conversation_id)
            rows = db.execute(
                "SELECT id, role, content, status, stats, from_draft FROM messages "
                "WHERE conversation_id = ? ORDER BY id", (conversation_id,)).fetchall()
            attached: dict[int, list[Attachment]] = {}
            for mid, path, content, sha256, added, origin in db.execute(
                    "SELECT a.message_id, a.path, a.content, a.sha256, a.added, a.origin FROM attachments a "
                    "JOIN messages m ON m.id = a.message_id WHERE m.conversation_id = ? ORDER BY a.id",
                    (conversation_id,)):
                attached.setdefault(mid, []).append(Attachment(path, content, sha256, added=added, origin=origin))
        return [Message(role, content, id=mid, status=status, stats=Stats.from_dict(json.loads(stats)) if stats else None,
                        from_draft=[c == "1" for c in from_draft] if from_draft is not None else None,
                        attachments=attached.get(mid, []))
                for mid, role, content, status, stats, from_draft in rows]

    def attach(self, message_id: int, attachments: Iterable[Attachment]) -> None:
        """Add `attachments` to stored message `message_id` (an edit applied from a reply)."""
        with self._tx() as db:
            _insert_attachments(db, message_id, attachments)

    def append(self, conversation_id: int, message: Message) -> int:
        """Add `message` at the end of the conversation; sets and returns its id."""
        now = time.time()
        with self._tx() as db:
            self._require(db, conversation_id)
            cur = db.execute(
                "INSERT INTO messages (conversation_id, role, content, status, stats, from_draft, created) "
                "VALUES (?, ?, ?, ?, ?, ?, ?)",
                (conversation_id, message.role, message.content, message.status, *_message_extras(message), now))
            _insert_attachments(db, cur.lastrowid, message.attachments)
            db.execute("UPDATE conversations SET updated = ? WHERE id = ?", (now, conversation_id))
            message.id = cur.lastrowid
            return message.id

    def update(self, message: Message) -> None:
        """Write a stored message's content, status, stats and token origins."""
        if message.id is None:
            raise ValueError("update() needs a stored message (its id is None)")
        with self._tx() as db:
            db.execute(
                "UPDATE messages SET content = ?, status = ?, stats = ?, from_draft = ? WHERE id = ?",
                (message.content, message.status, *_message_extras(message), message.id))
            db.execute("UPDATE conversations SET updated = ? WHERE id = "
                       "(SELECT conversation_id FROM messages WHERE id = ?)", (time.time(), message.id))

    def delete_from(self, conversation_id: int, message_id: int) -> None:
        """Delete message `message_id` and every later message of the conversation."""
        with self._tx() as db:
            db.execute("DELETE FROM messages WHERE conversation_id = ? AND id >= ?", (conversation_id, message_id))

    def last_message_id(self, conversation_id: int) -> int | None:
        """The id of the conversation's latest message (None: it has none)."""
        with self._reading() as db:
            row = db.execute("SELECT MAX(id) FROM messages WHERE conversation_id = ?", (conversation_id,)).fetchone()
            return row[0]

    # -- plumbing ----------------------------------------------------------------------
    def close(self) -> None:
        with self._reading() as db:
            db.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    @property
    def schema_version(self) -> int:
        with self._reading() as db:
            return db.execute("PRAGMA user_version").fetchone()[0]

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        """One write transaction: everything in the block is stored, or nothing."""
        with self._reading() as db:
            db.execute("BEGIN IMMEDIATE")
            try:
                yield db
                db.execute("COMMIT")
            except BaseException:
                if db.in_transaction:
                    db.execute("ROLLBACK")
                raise

    @contextmanager
    def _reading(self) -> Iterator[sqlite3.Connection]:
        """The connection, to one thread at a time; SQLite's errors become StoreErrors for people."""
        with self._lock:
            try:
                yield self._db
            except sqlite3.Error as e:
                raise _store_error(self.path, e) from e

    def _require(self, db: sqlite3.Connection, conversation_id: int) -> tuple:
        row = db.execute("SELECT id, title, created, updated, settings FROM conversations WHERE id = ?",
                         (conversation_id,)).fetchone() if _storable(conversation_id) else None
        if row is None:
            raise StoreError(f"There is no conversation {conversation_id}; `edgespec chats` lists them.")
        return row

    def _migrate(self) -> None:
        version = self.schema_version
        if version > len(MIGRATIONS):
            raise StoreError(
                f"{self.path} was written by a newer edgespec (schema version {version}; this one knows up to "
                f"{len(MIGRATIONS)}). Upgrade edgespec, or point it at another file.")
        for target in range(version + 1, len(MIGRATIONS) + 1):
            try:
                self._db.executescript(
                    f"BEGIN IMMEDIATE;\n{MIGRATIONS[target - 1]};\nPRAGMA user_version = {target};\nCOMMIT;")
            except sqlite3.Error as e:
                if self._db.in_transaction:
                    self._db.execute("ROLLBACK")
                raise StoreError(f"Could not upgrade {self.path} to schema version {target}: {e}") from e


SQLITE_PERM, SQLITE_BUSY, SQLITE_LOCKED, SQLITE_READONLY, SQLITE_IOERR, SQLITE_CORRUPT, SQLITE_FULL, \
    SQLITE_CANTOPEN, SQLITE_NOTADB = 3, 5, 6, 8, 10, 11, 13, 14, 26
"""SQLite's primary result codes (sqlite3.Error.sqlite_errorcode, extended codes reduced by & 0xFF)."""


def _store_error(path: Path, e: sqlite3.Error) -> StoreError:
    """A StoreError that names the file and says what to do about `e`."""
    code = (getattr(e, "sqlite_errorcode", None) or 0) & 0xFF
    if code in (SQLITE_READONLY, SQLITE_PERM, SQLITE_CANTOPEN):
        what = (f"{path} is read-only or cannot be written ({e}). Make it and its folder writable, or set "
                f"EDGESPEC_HOME to a folder you can write.")
    elif code == SQLITE_FULL:
        what = f"{path}: the disk is full ({e}). Free some space and try again; what was stored is kept."
    elif code in (SQLITE_CORRUPT, SQLITE_NOTADB):
        what = (f"{path} is damaged ({e}). Restart edgespec: it keeps the damaged file aside under a dated name "
                f"and starts a fresh one.")
    elif code in (SQLITE_BUSY, SQLITE_LOCKED):
        what = f"{path} is locked by another program ({e}). Close it and try again."
    elif code == SQLITE_IOERR:
        what = f"{path}: the disk could not be read or written ({e}). Check the disk and free space, then try again."
    else:
        what = f"{path}: {e}"
    return StoreError(what)


def _folded_contains(text: str, folded: str) -> bool:
    """Whether `text` holds `folded` (already casefolded), case ignored in every script:
    SQL's LIKE folds A-Z only, so "CAFÉ" would not find "café"."""
    return folded in text.casefold()


def _storable(conversation_id: int) -> bool:
    """Whether `conversation_id` fits SQLite's INTEGER (64 bits): a larger one names no
    conversation, and binding it would raise OverflowError, not "There is no conversation"."""
    return -(2**63) <= conversation_id < 2**63


_INFO_SQL = ("SELECT c.id, c.title, c.created, c.updated, "
             "(SELECT COUNT(*) FROM messages m WHERE m.conversation_id = c.id) FROM conversations c")


EARLIEST = datetime(1, 1, 3, tzinfo=timezone.utc).timestamp()
LATEST = datetime(9999, 12, 29, tzinfo=timezone.utc).timestamp()
"""The times (Unix) a conversation may have: what a datetime holds (years 1 to 9999),
less three days each end, so that each is a local date in every time zone
(0001-01-01T00:00:00+14:00 is in year 0, and datetime.fromtimestamp looks a day
either side of the time, in zones that were 16 hours off UTC then)."""


def local_time(when: float) -> datetime:
    """`when` (Unix time) as a local datetime, a time no date can hold read as the
    nearest one that can (EARLIEST, LATEST): a stored row must never lock a user out
    of their list. Older edgespecs imported such times unchecked."""
    if not isinstance(when, (int, float)) or when != when:  # NaN, or not a number at all: the oldest
        when = EARLIEST
    return datetime.fromtimestamp(min(max(when, EARLIEST), LATEST))


def _info(row: tuple) -> ConversationInfo:
    return ConversationInfo(row[0], row[1], local_time(row[2]), local_time(row[3]), row[4])


def _dumps(value) -> str:
    return json.dumps(value, ensure_ascii=False, default=str)


def _message_extras(m: Message) -> tuple[str | None, str | None]:
    stats = _dumps(m.stats.to_dict()) if m.stats is not None else None
    origins = "".join("1" if d else "0" for d in m.from_draft) if m.from_draft is not None else None
    return stats, origins


def _insert_attachments(db: sqlite3.Connection, message_id: int, attachments: Iterable[Attachment]) -> None:
    db.executemany(
        "INSERT INTO attachments (message_id, path, content, sha256, added, origin) VALUES (?, ?, ?, ?, ?, ?)",
        [(message_id, a.path, a.content, a.sha256, a.added, a.origin) for a in attachments])

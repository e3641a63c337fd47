"""One reply at a time in a stored conversation, across processes: a lock file
per conversation beside the store's database."""

from __future__ import annotations

import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

from filelock import FileLock, Timeout

from edgespec.chat.store import StoreError
from edgespec.errors import EdgespecError

WAIT_POLL_S = 0.1
"""How often a wait for another process's reply looks whether it was given up."""


class ReplyWaitStopped(EdgespecError):
    """A turn gave up waiting for another process's reply in its conversation."""


@contextmanager
def reply_lock(store_path: Path, conversation_id: int, *, on_wait: Callable[[], None] | None = None,
               stop: threading.Event | None = None) -> Iterator[None]:
    """Hold conversation `conversation_id` of the store at `store_path` for one
    turn, across processes: a second process answering in it waits here until
    the first one's reply is stored (calling `on_wait` once, when it has to
    wait), so that its prompt holds that reply rather than a half-written one.
    `stop` set while it waits gives up (ReplyWaitStopped): the other reply may
    take minutes, and a user who stops or quits must not wait for it."""
    if str(store_path) == ":memory:":  # no other process can see it
        yield
        return
    folder = store_path.with_name(store_path.name + ".locks")
    try:
        folder.mkdir(exist_ok=True)
    except OSError as e:
        raise StoreError(f"Cannot create {folder}: {e.strerror or e}. Make {store_path.parent} writable.") from None
    path = folder / f"{conversation_id}.lock"
    lock = FileLock(path, thread_local=False)
    try:
        try:
            lock.acquire(timeout=0)
        except Timeout:
            if on_wait is not None:
                on_wait()
            _wait(lock, stop)
    except OSError as e:  # not a lock file (a folder, a link that cannot be followed) or not writable
        raise StoreError(f"Cannot lock {path}: {e.strerror or e}. Remove it (edgespec makes it again) or make "
                         f"{folder} writable.") from None
    try:
        yield
    finally:
        lock.release()


def _wait(lock: FileLock, stop: threading.Event | None) -> None:
    """Acquire `lock`, giving up once `stop` is set."""
    while True:
        try:
            lock.acquire(timeout=WAIT_POLL_S)
            return
        except Timeout:
            if stop is not None and stop.is_set():
                raise ReplyWaitStopped("Stopped waiting for the other edgespec replying in this conversation: "
                                       "nothing was sent.") from None

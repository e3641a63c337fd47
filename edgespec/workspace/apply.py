"""Writing an edit to disk, atomically, and undoing it.

A file changes only by os.replace of a finished temporary file in the same folder: a full
disk, a read-only folder or Ctrl+C leaves the old bytes or the new ones, never a mix, and
no temporary file behind. A write goes ahead only while the file still has the sha256 the
reply was based on, and an undo only while it still has the one the write left. The
previous bytes are kept in a backups folder (named by their sha256), so an undo can be
rebuilt after a restart with Applied.from_backup.

A reply that changes several files is applied all or nothing (apply_all): every file is
checked before any is written, and a write that still fails midway puts back the files
written before it, so the user is never left with half a change they did not see.
"""

from __future__ import annotations

import errno
import functools
import os
import secrets
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from edgespec.errors import EditError, FileAccessError, FileTooLargeError, StaleFileError, WriteError
from edgespec.workspace.edits import FileEdit
from edgespec.workspace.root import MAX_FILE_BYTES, Workspace, read_regular, sha256_hex

TEMP_SUFFIX = ".edgespec-tmp"
"""How the temporary file of a write ends (beside the file, hidden)."""


@dataclass(frozen=True)
class Applied:
    """An edit written to disk: what undo needs."""

    path: str
    """The file, relative to the root (symlinks resolved)."""
    before: bytes | None
    """The previous bytes; None when the edit created the file."""
    after_sha256: str
    """The sha256 of the bytes written: undo goes ahead only while the file still has it."""
    backup: Path | None
    """Where the previous bytes are kept (None for a new file)."""

    @classmethod
    def from_backup(cls, path: str, after_sha256: str, backup: Path | None) -> Applied:
        """An Applied rebuilt from what was stored (after a restart): the previous bytes read back from `backup`."""
        if backup is None:
            return cls(path, None, after_sha256, None)
        try:
            before = backup.read_bytes()
        except OSError:
            raise FileAccessError(f"The saved copy of {path} is gone ({backup}), so this change cannot be undone.") from None
        if sha256_hex(before) != backup.name:
            raise FileAccessError(f"The saved copy of {path} is damaged ({backup}), so this change cannot be undone.")
        return cls(path, before, after_sha256, backup)


def apply_edit(
    workspace: Workspace, edit: FileEdit, *, base_sha256: str | None, allow_new: bool = False, backups: Path
) -> Applied:
    """Write `edit` if the file still has `base_sha256` (None: it must not exist yet, and allow_new is required)."""
    checked = _check(workspace, edit, base_sha256=base_sha256, allow_new=allow_new)
    backup = _keep(backups, checked.current, checked.rel) if checked.current is not None else None
    if checked.current is None:
        _make_folders(checked.full.parent, checked.rel)
    write_atomic(checked.full, checked.data, checked.rel)
    return Applied(path=checked.rel, before=checked.current, after_sha256=sha256_hex(checked.data), backup=backup)


def apply_all(
    workspace: Workspace, edits: Sequence[tuple[FileEdit, str | None]], *, allow_new: bool = False, backups: Path
) -> list[Applied]:
    """Write every (edit, base_sha256) of `edits`, or none of them.

    Whatever can be known before writing (each file still as the reply saw it, writable,
    within the limit, a folder for it that can be made) is checked for every file, and the
    previous bytes are kept, before the first is written: the usual refusals write nothing.
    A write that fails even so (a full disk) puts back the files written before it, newest
    first, and its error says so; one that cannot be put back is named with its saved copy."""
    seen: set[str] = set()
    for edit, base_sha256 in edits:
        checked = _check(workspace, edit, base_sha256=base_sha256, allow_new=allow_new)
        if checked.rel in seen:
            raise EditError(f"The reply changes {checked.rel} twice (under two names); nothing was written.")
        seen.add(checked.rel)
        if checked.current is not None:
            _keep(backups, checked.current, checked.rel)
    applied: list[Applied] = []
    try:
        for edit, base_sha256 in edits:
            applied.append(apply_edit(workspace, edit, base_sha256=base_sha256, allow_new=allow_new, backups=backups))
    except FileAccessError as error:
        if not applied:
            raise
        words, left = _put_back(workspace, applied)
        failed = type(error)(f"{error} {words}")
        failed.left_changed = left
        raise failed from None
    except BaseException:  # Ctrl+C midway: the same, all or nothing
        _put_back(workspace, applied)
        raise
    return applied


def _put_back(workspace: Workspace, applied: Sequence[Applied]) -> tuple[str, tuple[str, ...]]:
    """Undo `applied`, newest first, going on past a file that cannot be: what became of each,
    for the error, and the files left changed."""
    restored, left, words = [], [], []
    for done in reversed(applied):
        try:
            undo(workspace, done)
        except FileAccessError as error:
            left.append(done.path)
            if done.backup is None:
                words.append(f"{done.path}, which this apply created, could not be deleted; delete it to undo the "
                            f"change.")
            elif isinstance(error, StaleFileError):
                words.append(f"{done.path} changed again before it could be put back, so it was left as it is; its "
                            f"bytes before this apply are kept in {done.backup}.")
            else:
                words.append(f"{done.path} could not be put back either and keeps the reply's version; its previous "
                            f"bytes are kept in {done.backup}.")
        else:
            restored.append(done.path)
    if not left:
        return f"{', '.join(restored)} {'was' if len(restored) == 1 else 'were'} put back; nothing was changed.", ()
    back = f"{', '.join(restored)} {'was' if len(restored) == 1 else 'were'} put back. " if restored else ""
    return back + " ".join(words), tuple(left)


@dataclass(frozen=True)
class _Checked:
    """An edit that passed every check made before writing: what the write needs."""

    full: Path
    rel: str
    current: bytes | None
    data: bytes


def _check(workspace: Workspace, edit: FileEdit, *, base_sha256: str | None, allow_new: bool) -> _Checked:
    """Refuse `edit` for whatever can be known before writing (see apply_edit); nothing is written."""
    full = workspace.resolve(edit.path)
    rel = full.relative_to(workspace.root).as_posix()
    current = _current(full, rel)
    if base_sha256 is None:
        if current is not None:
            raise StaleFileError(f"{rel} exists now but the reply created it as a new file; attach it and ask again.")
        if not allow_new:
            raise EditError(f"{rel} is not an attached file; confirm that the reply may create it.")
    elif current is None:
        raise StaleFileError(f"{rel} was deleted after the reply was written; the change was not applied.")
    elif sha256_hex(current) != base_sha256:
        raise StaleFileError(f"{rel} changed on disk after the reply was written; attach it again and ask again.")
    data = edit.new_text.encode("utf-8")
    if len(data) > MAX_FILE_BYTES:
        raise FileTooLargeError(f"The reply's version of {rel} is over the {MAX_FILE_BYTES // 1024} KiB limit for files in a chat; it was not written.")
    if current is not None:
        try:
            _refuse_read_only(os.stat(full), rel)
        except FileNotFoundError:
            raise StaleFileError(f"{rel} was deleted after the reply was written; the change was not applied.") from None
        except OSError as error:
            raise WriteError(_write_failed(rel, error)) from None
    _check_folder(workspace, full.parent, rel)
    return _Checked(full, rel, current, data)


def _check_folder(workspace: Workspace, folder: Path, rel: str) -> None:
    """Refuse a file whose folder (or, for a new file, the nearest one there is) cannot be written in.

    A write makes a temporary file there and renames it, so the folder's permission is what
    counts; access() also knows what the mode bits do not say for root (a read-only file
    system, an immutable folder)."""
    while not os.path.lexists(folder) and folder != workspace.root:
        folder = folder.parent
    name = folder.relative_to(workspace.root).as_posix() if folder != workspace.root else "the project folder"
    if not folder.is_dir():
        raise WriteError(f"The folder for {rel} cannot be created ({name} is not a folder); nothing was written.")
    effective = {"effective_ids": True} if os.access in os.supports_effective_ids else {}
    if not os.access(folder, os.W_OK | os.X_OK, **effective):
        raise WriteError(f"{rel} cannot be written: {name} does not allow changes (its permissions, a read-only file "
                         f"system or an immutable flag); make it writable. Nothing was written.")


def undo(workspace: Workspace, applied: Applied) -> None:
    """Put back the bytes before `applied` (or delete the file it created), while the file is as it left it."""
    full = workspace.resolve(applied.path)
    rel = full.relative_to(workspace.root).as_posix()
    current = _current(full, rel)
    if current is None or sha256_hex(current) != applied.after_sha256:
        raise StaleFileError(f"{rel} changed after the edit was applied; undo would lose those changes, so it was not done.")
    if applied.before is None:
        try:
            full.unlink()
        except OSError as error:
            raise WriteError(f"{rel} could not be deleted ({error.strerror}); check the folder's permissions.") from None
        return
    write_atomic(full, applied.before, rel)


def _current(full: Path, rel: str) -> bytes | None:
    """The file's bytes now (None when missing); one that grew over the limit cannot be the one a reply saw."""
    try:
        return read_regular(full, rel, limit=MAX_FILE_BYTES)
    except FileAccessError as error:
        if type(error) is FileAccessError:
            raise
        raise StaleFileError(f"{rel} changed on disk and is no longer a text file within the limit; nothing was written.") from None


def _keep(backups: Path, data: bytes, rel: str) -> Path:
    """Store `data`, the bytes of `rel` before a write, under backups/<sha256> (once) and return that path."""
    path = backups / sha256_hex(data)
    if path.is_file():
        return path

    def failed(error: OSError) -> str:  # the user knows the file, not the hash-named copy
        return f"The copy of {rel} that undo needs could not be saved in {backups} ({_reason(error)}); nothing was written."

    try:
        backups.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise WriteError(failed(error)) from None
    write_atomic(path, data, str(path), failed=failed)
    return path


def _make_folders(folder: Path, rel: str) -> None:
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise WriteError(f"The folder for {rel} cannot be created ({error.strerror}); nothing was written.") from None


def write_atomic(target: Path, data: bytes, rel: str, *, failed: Callable[[OSError], str] | None = None) -> None:
    """Replace `target` by `data`: a temporary file in the same folder (same permissions), fsync, os.replace.

    A failure raises WriteError worded by `failed` (default: `rel` could not be written)."""
    failed = failed or functools.partial(_write_failed, rel)
    try:
        info: os.stat_result | None = os.stat(target)
    except FileNotFoundError:
        info = None
    except OSError as error:
        raise WriteError(failed(error)) from None
    if info is not None:
        _refuse_read_only(info, rel)
    temp = target.parent / f".{target.name}.{secrets.token_hex(4)}{TEMP_SUFFIX}"
    created = False
    try:
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666 if info is None else stat.S_IMODE(info.st_mode))
        created = True
        with os.fdopen(fd, "wb") as handle:
            if info is not None:
                _keep_owner(handle.fileno(), info)
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temp, target)  # the commit point: before it the old bytes, after it the new ones
        created = False
    except OSError as error:
        raise WriteError(failed(error)) from None
    finally:
        if created:
            try:
                os.unlink(temp)
            except OSError:
                pass
    _sync_folder(target.parent)


def _refuse_read_only(info: os.stat_result, rel: str) -> None:
    """A file whose mode lets no one write it is kept: a rename needs only the folder's
    permission (and root may write anything), so the mode alone says what its owner meant."""
    if not info.st_mode & (stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH):
        raise WriteError(f"{rel} is read-only; make it writable to change it. Nothing was written.")


def _keep_owner(fd: int, info: os.stat_result) -> None:
    """The same mode bits (the umask does not apply) and, where allowed, the same owner as the file replaced."""
    os.fchmod(fd, stat.S_IMODE(info.st_mode))
    if hasattr(os, "fchown") and (info.st_uid, info.st_gid) != (os.geteuid(), os.getegid()):
        try:
            os.fchown(fd, info.st_uid, info.st_gid)
        except OSError:
            pass


def _sync_folder(folder: Path) -> None:
    """Make the rename itself durable (best effort: not every system can fsync a folder)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


_REASONS = {
    errno.ENOSPC: "the disk is full; free some space",
    errno.EDQUOT: "the disk quota is used up; free some space",
    errno.EACCES: "permission denied; check the folder's permissions",
    errno.EPERM: "permission denied; check the folder's permissions",
    errno.EROFS: "the folder is on a read-only file system",
}


def _reason(error: OSError) -> str:
    return _REASONS.get(error.errno or 0, error.strerror or str(error))


def _write_failed(rel: str, error: OSError) -> str:
    return f"{rel} could not be written ({_reason(error)}); the file was left as it was."

"""Resumable HTTP downloads of one file, never visible half-written.

    download(url, Path("models/x.gguf"), size=4_683_073_536, progress=bar, check=verify)

The bytes go to `x.gguf.part` next to the destination. Whatever stops a transfer
(a dropped connection, Ctrl+C, the app's Cancel, a crash) leaves that file
behind, and the next call asks the server only for the missing bytes (an HTTP
Range request). The resume names the file it continues (If-Range with the first
answer's ETag, kept in `x.gguf.part.etag` beside the .part): a file that changed
on the server in between is sent whole (200) and started over, never spliced
onto the old bytes, and so is the file from a server that ignores Range. An
answer that is visibly not the file (a web page: a captive portal's; to a resume,
also another length than `size`, or bytes from elsewhere than where the .part
ends) raises NotTheFile and leaves the .part as it was. A download that stops
before its first byte leaves no .part.

`check` sees the complete .part before it is renamed to the destination, so a
file under the final name is always whole. A check says the file is wrong by
raising an EdgespecError (verify_file's DownloadError, the GGUF header's
ModelFileError): then the .part is deleted. Anything else that stops it (Ctrl+C,
the app's Cancel raised from a progress callback, a read error) keeps the .part,
whose bytes are as good as they were: the next call only checks it again.

The .part is locked (POSIX) from the first byte until it has its final name: a
second download of the same file, or remove_part() (`edgespec rm`), is refused
meanwhile rather than taking the file from under the check or the transfer.

The network waits (connecting, reading, the pauses between tries) run in a
helper thread while this one asks the progress callback every POLL seconds, so
a cancel raised from it is seen while the server stalls. HTTP errors
(urllib.error.HTTPError) and network errors that outlast the retries (OSErrors
such as URLError and TimeoutError, and http.client's HTTPException for a garbled
answer) are raised as they are; the caller turns them into messages. A server
that says it is busy (429, 503, ...) counts as a failed try, as a dropped
connection does: the next waits at least what its Retry-After asks, and one that
asks for more than LONGEST_WAIT is raised at once (`retry_after` reads it).

Why not huggingface_hub's hf_hub_download: it downloads to a temporary file
that it deletes whenever the transfer stops (Ctrl+C, a dropped connection), so
an interrupted multi-GB model starts over from byte 0. Here it resumes.
"""

from __future__ import annotations

import contextlib
import email.utils
import errno
import http.client
import os
import queue
import re
import shutil
import threading
import time
from datetime import timezone
from pathlib import Path
from typing import IO, Callable, Mapping
from urllib.error import HTTPError, URLError
from urllib.parse import urlsplit
from urllib.request import HTTPRedirectHandler, Request, build_opener

from edgespec.config import read_kept, try_lock
from edgespec.errors import EdgespecError
from edgespec.models.progress import Meter, ProgressCallback

__all__ = ["BUSY", "ETAG_SUFFIX", "NoRoom", "NotTheFile", "PART_SUFFIX", "download", "part_path", "remove_part",
           "retry_after"]

PART_SUFFIX = ".part"
"""Added to a file's name for its unfinished download, beside it."""
ETAG_SUFFIX = PART_SUFFIX + ".etag"
"""Added to a file's name for the ETag of the file its .part holds the start of."""
CHUNK = 1 << 20
"""The most bytes one read asks for (it returns what has come, however little)."""
RETRIES = 5
"""Attempts in a row that may fail without a single new byte before giving up."""
POLL = 1.0
"""Seconds between calls of the progress callback while nothing comes (a stalled server, a pause
between tries): the callback may stop the download (the app's Cancel raises from it)."""
BUSY = frozenset({429, 502, 503, 504})
"""HTTP statuses that say "try again later" (too many requests, a gateway or the server overloaded)."""
LONGEST_WAIT = 60.0
"""The longest Retry-After a download waits out; a server that asks for more is left at once,
with the .part kept, rather than holding the command for hours."""


class NotTheFile(Exception):
    """The server answered with something that is visibly not the file (a web page; to a resume,
    another length than the file's): a captive portal's sign-in page, a proxy's error page. The
    .part is left as it was (none, if this was the first request)."""

    def __init__(self, message: str, *, start: int):
        super().__init__(message)
        self.start = start
        """The byte the request asked for the file from (0: the whole file)."""


class NoRoom(OSError):
    """The disk has less free space than the rest of the file needs, as the server gives its
    length: found before writing any of it, so the disk is never filled to its last byte (which
    every other program's writes need too). The .part is left as it was."""

    def __init__(self, needed: int, free: int):
        super().__init__(errno.ENOSPC, f"the rest of the file needs {needed} bytes and the disk has {free} free")
        self.needed, self.free = needed, free


def download(url: str, dest: Path, *, headers: Mapping[str, str] | None = None, size: int | None = None,
             progress: ProgressCallback | None = None, check: Callable[[Path], None] | None = None,
             timeout: float = 30.0) -> Path:
    """Download `url` to `dest` through `dest.part`, resuming a partial file; returns `dest`.

    `size` (when known) is the expected length: a longer .part is started over, and an answer
    of another length to a resume raises NotTheFile. `timeout` is how long the server may stay
    silent (connecting, or between two bytes) before a try counts as failed.
    """
    part = part_path(dest)
    part.parent.mkdir(parents=True, exist_ok=True)
    f, locked = _open_locked(part, "ab")
    with f:
        meter = Meter(progress, dest.name, size, initial=f.tell())
        worker = _Worker(meter)
        try:
            _fill(f, url, dict(headers or {}), size, _etag_path(dest), meter, worker, timeout)
        except BaseException:
            if f.tell() == 0:  # nothing came (a 404, a page, no network): nothing to resume, no .part
                with contextlib.suppress(OSError):
                    part.unlink()
                    _etag_path(dest).unlink(missing_ok=True)
            raise
        finally:
            worker.close()
        meter.close()
        f.flush()
        os.fsync(f.fileno())
        if not locked:
            f.close()  # no lock to keep (Windows), where a file still open cannot be renamed or deleted
        if check is not None:
            try:
                check(part)
            except EdgespecError:  # the file is wrong: start from scratch next time
                part.unlink(missing_ok=True)
                _etag_path(dest).unlink(missing_ok=True)
                raise
        os.replace(part, dest)  # still under the lock: nobody appends to or deletes the .part meanwhile
        _etag_path(dest).unlink(missing_ok=True)
    return dest


def part_path(dest: Path) -> Path:
    """Where the partial download of `dest` lives."""
    return dest.with_name(dest.name + PART_SUFFIX)


def remove_part(dest: Path) -> Path | None:
    """Delete the partial download of `dest` (and its ETag); returns the .part deleted, if any.

    Raises BlockingIOError while a download writes it: deleting it under a running download
    would leave that download writing into a file nobody can see, which it could not resume.
    """
    try:
        f, _ = _open_locked(part_path(dest), "rb")
    except FileNotFoundError:
        _etag_path(dest).unlink(missing_ok=True)
        return None
    with f:
        part_path(dest).unlink()
        _etag_path(dest).unlink(missing_ok=True)
    return part_path(dest)


def _fill(f, url: str, headers: dict[str, str], size: int | None, etag: Path, meter: Meter,
          worker: _Worker, timeout: float) -> None:
    """Append to `f` until it holds the whole file, retrying what fails without new bytes."""
    failures = 0
    while True:
        have = f.tell()
        if size is not None and have >= size:  # complete already (cut off while checked), or not this file
            if have == size:
                return
            _restart(f, meter, etag)
            continue
        error: Exception | None = None
        asked = 0.0  # what a busy server's Retry-After asks to wait before the next try
        try:
            total = _transfer(f, url, dict(headers), size, etag, meter, worker, timeout)
            if total is not None and f.tell() < total:
                error = ConnectionError(f"the server closed the connection after {f.tell()} of {total} bytes")
        except HTTPError as e:
            if e.code == 416 and have:  # nothing to send from `have` on: the .part is not this file
                _restart(f, meter, etag)
                continue
            asked = retry_after(e) or 0.0
            if e.code not in BUSY or asked > LONGEST_WAIT:
                raise
            e.close()
            error = e
        except (URLError, ConnectionError, TimeoutError, http.client.HTTPException) as e:
            error = e
        if error is None:
            return
        if f.tell() != have:  # some bytes came: ask for the rest straight away
            failures = 0
            continue
        failures += 1
        if failures >= RETRIES:
            raise error
        _wait(max(asked, min(8.0, 0.25 * 2 ** (failures - 1))), meter)


def retry_after(error: HTTPError) -> float | None:
    """The seconds a busy server's Retry-After header asks to wait (a number of seconds or an
    HTTP date), or None where it names none."""
    value = (error.headers.get("Retry-After") or "").strip() if error.headers is not None else ""
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:  # HTTP dates are in GMT ("-0000" reads as no zone)
        when = when.replace(tzinfo=timezone.utc)
    return max(0.0, when.timestamp() - time.time())


def _transfer(f, url: str, headers: dict[str, str], size: int | None, etag: Path, meter: Meter,
              worker: _Worker, timeout: float) -> int | None:
    """Append the rest of `url` to `f` (from byte f.tell()); returns the file's full length if known."""
    start = f.tell()
    if start:
        headers["Range"] = f"bytes={start}-"
        validator = _read_etag(etag)
        if validator:
            headers["If-Range"] = validator  # the file changed since: the server sends all of it (200)
    response = worker.call(_opener.open, Request(url, headers=headers), timeout=timeout)
    try:
        if response.status != 206:  # the whole file: asked for, or Range ignored, or another file
            _check_whole(response, size, start)
            if start:
                _restart(f, meter, etag)
                start = 0
        else:
            _check_rest(response, start)
        if not start:
            _write_etag(etag, response)
        total = _full_length(response, start)
        if total is not None:
            _check_room(os.path.dirname(f.name), total - start)
        if total is not None and meter.total is None:
            meter.total = total
        read = getattr(response, "read1", response.read)  # what has come: progress on a slow link too
        while chunk := worker.call(read, CHUNK):
            f.write(chunk)
            meter.update(len(chunk))
    finally:
        worker.later(response.close)  # after a read still waiting for the server, if any
    f.flush()
    return total


def _check_whole(response, size: int | None, start: int) -> None:
    """Raise NotTheFile if a 200 answer is visibly not the file: a web page (a model file is
    never text/html; this also guards a file whose size is not known), or, to a resume, another
    length than the file's. Anything else is taken for the whole file, changed or not (a first
    answer of another length is left to the check of the finished file)."""
    length = response.headers.get("Content-Length")
    kind = (response.headers.get("Content-Type") or "").split(";")[0].strip().lower()
    if start and size is not None and length is not None and length.isdigit() and int(length) != size:
        what = f"{length} bytes{f' ({kind})' if kind else ''} where the file has {size}"
    elif kind == "text/html":
        what = f"a web page ({kind})"
    else:
        return
    asked = f"the rest of the file from byte {start}" if start else "the file"
    raise NotTheFile(f"asked for {asked}, the server answered with {what}: that is not the file", start=start)


_CONTENT_RANGE = re.compile(r"bytes (\d+)-\d+/(\d+|\*)")


def _check_room(folder: str, needed: int) -> None:
    """Raise NoRoom if `folder`'s disk has less than `needed` bytes free (where it says: a file
    system that cannot tell is left to report a full disk as it fills)."""
    try:
        free = shutil.disk_usage(folder).free
    except OSError:
        return
    if free < needed:
        raise NoRoom(needed, free)


def _check_rest(response, start: int) -> None:
    """Raise NotTheFile if a 206 answer's bytes do not start where the .part ends (a proxy that
    answers Range its own way): appended, they would splice another part of the file in."""
    value = (response.headers.get("Content-Range") or "").strip()
    match = _CONTENT_RANGE.fullmatch(value)
    if match and int(match[1]) == start:
        return
    what = f"bytes from {match[1]} on" if match else f"a Content-Range of {value[:60]!r}"
    raise NotTheFile(f"asked for the rest of the file from byte {start}, the server answered with {what}: "
                     f"that is not what was asked", start=start)


def _full_length(response, start: int) -> int | None:
    """The whole file's length, from Content-Range (checked by _check_rest) or Content-Length;
    None where neither says (a Content-Length that is no number counts as none, as in http.client)."""
    match = _CONTENT_RANGE.fullmatch((response.headers.get("Content-Range") or "").strip())
    if response.status == 206 and match and match[2] != "*":
        return int(match[2])
    length = (response.headers.get("Content-Length") or "").strip()
    return start + int(length) if length.isdigit() else None


def _restart(f, meter: Meter, etag: Path) -> None:
    f.seek(0)
    f.truncate()
    etag.unlink(missing_ok=True)
    meter.set(0)


def _etag_path(dest: Path) -> Path:
    """Where the ETag of the file that `dest`'s .part holds the start of is kept."""
    return dest.with_name(dest.name + ETAG_SUFFIX)


def _write_etag(etag: Path, response) -> None:
    """Keep what identifies the file now started (a strong ETag, else Last-Modified) for If-Range."""
    value = response.headers.get("ETag")
    if not value or value.startswith("W/"):  # a weak ETag cannot be used in If-Range
        value = response.headers.get("Last-Modified")
    etag.unlink(missing_ok=True)  # whatever is in its place goes: a write into a FIFO would block
    if value:
        etag.write_text(value + "\n", encoding="latin-1")  # a header value's own encoding: read back as it came


def _read_etag(etag: Path) -> str | None:
    """The kept ETag, or None where there is none or what is kept cannot be a header value
    (damaged: a control character, a line break): the .part is resumed as one kept without it."""
    try:
        # never blocks (a FIFO there); at most http.client's longest header line
        value = read_kept(etag, limit=1 << 16).decode("latin-1").strip()
    except (OSError, ValueError):
        return None
    return value if value and value.isprintable() else None


def _wait(seconds: float, meter: Meter) -> None:
    """Sleep, asking the progress callback every POLL seconds (it may cancel)."""
    end = time.monotonic() + seconds
    while (left := end - time.monotonic()) > 0:
        time.sleep(min(left, POLL))
        meter.poke()


class _Worker:
    """Runs the blocking network calls of one download in a daemon thread, while the calling
    thread waits for each and asks the progress callback every POLL seconds meanwhile: a cancel
    raised from it ends the download at once, however long the server stays silent. (A call
    left waiting ends on its own socket timeout, in the background.)"""

    def __init__(self, meter: Meter):
        self.meter = meter
        self._tasks: queue.SimpleQueue = queue.SimpleQueue()
        threading.Thread(target=self._run, name="edgespec-download", daemon=True).start()

    def call(self, fn, *args, **kwargs):
        done: queue.SimpleQueue = queue.SimpleQueue()
        self._tasks.put((fn, args, kwargs, done))
        while True:
            try:
                ok, value = done.get(timeout=POLL)
            except queue.Empty:
                self.meter.poke()
                continue
            if ok:
                return value
            raise value

    def later(self, fn, *args) -> None:
        """Run `fn` after what the thread is doing, without waiting for it."""
        self._tasks.put((fn, args, {}, None))

    def close(self) -> None:
        self._tasks.put(None)

    def _run(self) -> None:
        while (task := self._tasks.get()) is not None:
            fn, args, kwargs, done = task
            try:
                result = (True, fn(*args, **kwargs))
            except BaseException as e:  # handed to the waiting thread, which raises it
                result = (False, e)
            if done is not None:
                done.put(result)


def _open_locked(part: Path, mode: str) -> tuple[IO[bytes], bool]:
    """`part` opened and locked; whether it is locked (no locks outside POSIX).

    Raises BlockingIOError if another process (or another download here) holds the lock. The
    file locked is checked to be the one still named `part`: one renamed to its final name or
    deleted between the open and the lock is let go, and `part` opened again."""
    while True:
        f = part.open(mode)
        try:
            locked = _lock(f, part)
            if not locked or os.path.samestat(os.fstat(f.fileno()), os.stat(part)):
                return f, locked
        except FileNotFoundError:
            pass
        except BaseException:
            f.close()
            raise
        f.close()


def _lock(f, part: Path) -> bool:
    """Refuse a .part another process is writing (POSIX; elsewhere no lock: returns False)."""
    locked = try_lock(f)
    if locked is False:
        raise BlockingIOError(f"{part} is being downloaded by another process")
    return bool(locked)


class _DropAuthOnOtherHosts(HTTPRedirectHandler):
    """Follow redirects (the hub sends files from a CDN) without handing the token to another host,
    nor to the same host over another scheme (from https to http it would travel in clear)."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        new = super().redirect_request(req, fp, code, msg, headers, newurl)
        old_url, new_url = urlsplit(req.full_url), urlsplit(newurl)
        if new is not None and (new_url.scheme, new_url.netloc) != (old_url.scheme, old_url.netloc):
            new.remove_header("Authorization")
        return new


_opener = build_opener(_DropAuthOnOtherHosts)

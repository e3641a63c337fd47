"""KV snapshot files that edgespec did not write, or that llama.cpp will not take:
whatever sits in the cache folder, a run answers, and a file that cannot serve
is gone after one run (with one line in the log), never retried."""

from __future__ import annotations

import json
import logging
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest

from edgespec.engine.snapshots import MAGIC, Snapshot, SnapshotCache
from tests.blocking import unblock

KEY = "k" * 32


def write_file(path: Path, header: dict | bytes, tokens: np.ndarray, data: bytes) -> Path:
    """A snapshot file as SnapshotCache.save lays it out, with any header."""
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(struct.pack("<8sI", MAGIC, len(raw)) + raw + tokens.astype("<i4").tobytes() + data)
    return path


def whole_header(tokens: np.ndarray, data: bytes, **forged) -> dict:
    return {"key": KEY, "n_tokens": int(tokens.size), "data_bytes": len(data), "crc32": zlib.crc32(data)} | forged


TOKENS = np.arange(100, 164, dtype=np.int32)
DATA = bytes(range(256)) * 4

FORGED = {
    "a trillion tokens": whole_header(TOKENS, DATA, n_tokens=10**12),
    "a terabyte of state": whole_header(TOKENS, DATA, data_bytes=10**12),
    "negative tokens": whole_header(TOKENS, DATA, n_tokens=-4),
    "negative state": whole_header(TOKENS, DATA, data_bytes=-1),
    "infinite tokens": json.dumps(whole_header(TOKENS, DATA)).replace('"n_tokens": 64', '"n_tokens": 1e999').encode(),
    "tokens as text": whole_header(TOKENS, DATA, n_tokens="64"),
    "tokens as a fraction": whole_header(TOKENS, DATA, n_tokens=64.5),
    "a header of nested lists": b"[" * 2000 + b"]" * 2000,
    "a header that is a list": b"[1, 2, 3]",
    "not utf-8": b"\xff\xfe{}",
}


@pytest.fixture
def disk(tmp_path) -> Path:
    return tmp_path / "kv"


def cache(disk: Path) -> SnapshotCache:
    return SnapshotCache(ram_bytes=1 << 20, disk=disk, disk_bytes=1 << 20)


def warnings(caplog) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "edgespec.cache" and r.levelno >= logging.WARNING]


# -- item 4: every count a file states is bounded by the file's size ---------------------------------

@pytest.mark.parametrize("forged", FORGED.values(), ids=FORGED.keys())
def test_a_forged_header_is_dropped_with_a_line_in_the_log_and_nothing_allocated(disk, caplog, forged):
    path = write_file(disk / KEY / "forged.kv", forged, TOKENS, DATA)
    with caplog.at_level(logging.WARNING, logger="edgespec.cache"):
        assert cache(disk).find(KEY, TOKENS.tolist(), more_than=0) is None
    assert not path.exists()
    assert len(warnings(caplog)) == 1
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="edgespec.cache"):  # the next run: nothing left to say
        assert cache(disk).find(KEY, TOKENS.tolist(), more_than=0) is None
    assert warnings(caplog) == []


def test_a_forged_file_beside_a_whole_one_does_not_hide_it(disk):
    good = Snapshot(KEY, TOKENS, DATA)
    assert cache(disk).save(good)
    forged = write_file(disk / KEY / "forged.kv", FORGED["a trillion tokens"], TOKENS, DATA)
    found = cache(disk).find(KEY, TOKENS.tolist() + [7], more_than=0)
    assert found is not None and found.source == "disk" and found.snapshot.data == DATA
    assert not forged.exists()


def test_a_file_larger_than_the_disk_budget_was_not_written_by_edgespec(disk):
    """save() never writes past the budget, so a bigger file is dropped unread."""
    data = b"x" * 4096
    path = write_file(disk / KEY / "big.kv", whole_header(TOKENS, data), TOKENS, data)
    small = SnapshotCache(ram_bytes=1 << 20, disk=disk, disk_bytes=2048)
    assert small.find(KEY, TOKENS.tolist(), more_than=0) is None
    assert not path.exists()


def test_a_run_answers_over_a_forged_file_and_it_is_gone_after(synth_target, disk):
    from edgespec.engine.events import GenerationParams
    from edgespec.engine.runtime import CacheSettings, Engine, ModelSettings

    def load():
        return Engine.load(ModelSettings(synth_target, n_ctx=512, flash_attn=True),
                           cache=CacheSettings(slots=1, disk=disk))

    prompt = [1, *range(10, 200)]
    with load() as engine:
        key = engine._target.pool.key
    forged = write_file(disk / key / "forged.kv", whole_header(np.asarray(prompt), DATA, key=key, n_tokens=10**12),
                        np.asarray(prompt, dtype=np.int32), DATA)
    with load() as engine:
        chunks = list(engine.generate(prompt, GenerationParams(mode="plain", max_tokens=4)))
    assert sum(len(c.tokens) for c in chunks) == 4 and chunks[-1].stats.prompt_evaluated == len(prompt)
    assert not forged.exists()


# -- item 7: what a path is, before it is opened ------------------------------------------------

def find_within(snapshots: SnapshotCache, tokens, seconds: float = 30):
    """find() in a thread, failing if it has not returned in `seconds` (a blocked open)."""
    import threading

    result = {}
    worker = threading.Thread(target=lambda: result.update(found=snapshots.find(KEY, tokens, more_than=0)),
                              daemon=True)
    worker.start()
    worker.join(seconds)
    return worker.is_alive(), result.get("found")


@pytest.mark.parametrize("where", ["in the folder", "behind a symlink"])
def test_a_fifo_named_kv_does_not_block_a_run(disk, tmp_path, where):
    import os

    assert cache(disk).save(Snapshot(KEY, TOKENS, DATA))
    fifo = (disk / KEY / "fifo.kv") if where == "in the folder" else (tmp_path / "fifo")
    os.mkfifo(fifo)
    if where == "behind a symlink":
        (disk / KEY / "link.kv").symlink_to(fifo)
    try:
        blocked, found = find_within(cache(disk), TOKENS.tolist() + [7])
        assert not blocked
        assert found is not None and found.source == "disk" and found.snapshot.data == DATA
        disk_cache = cache(disk)
        disk_cache.save(Snapshot(KEY, TOKENS[:40], DATA))  # trimming the disk walks the folder too
    finally:
        unblock(fifo)


def test_a_folder_named_kv_is_left_alone_and_says_nothing(disk, caplog):
    assert cache(disk).save(Snapshot(KEY, TOKENS, DATA))
    (disk / KEY / "x.kv").mkdir()
    with caplog.at_level(logging.INFO, logger="edgespec.cache"):
        found = cache(disk).find(KEY, TOKENS.tolist() + [7], more_than=0)
    assert found is not None and found.source == "disk"
    assert warnings(caplog) == []
    assert (disk / KEY / "x.kv").is_dir()


def test_a_file_deleted_as_soon_as_it_is_saved_loses_only_that_snapshot(disk, monkeypatch):
    """Another process shares the folder: `edgespec cache clear`, or its trim past the budget, may
    delete a file the moment it is renamed into place. The reply goes on from RAM."""
    import os

    from edgespec.engine import snapshots

    real_replace = os.replace

    def replaced_then_deleted(src, dst):
        real_replace(src, dst)
        os.unlink(dst)

    monkeypatch.setattr(snapshots.os, "replace", replaced_then_deleted)
    kept = cache(disk)
    kept.save(Snapshot(KEY, TOKENS, DATA))
    monkeypatch.undo()
    assert list(disk.rglob("*.kv")) == []
    kept.keep(Snapshot(KEY, TOKENS, DATA))
    assert kept.find(KEY, TOKENS.tolist() + [7], more_than=0).source == "ram"


def test_a_save_cut_short_by_a_kill_leaves_no_file_past_the_next_save(disk):
    """SIGKILL while a snapshot is written leaves its temporary file (hidden, outside the budget):
    the next save deletes one that old, and leaves one still being written by another process."""
    import os
    import time

    folder = disk / KEY
    folder.mkdir(parents=True)
    killed, writing = folder / ".0123.kv.99999.tmp", folder / ".4567.kv.99998.tmp"
    for path in (killed, writing):
        path.write_bytes(b"x" * 1000)
    hours_ago = time.time() - 2 * 3600
    os.utime(killed, (hours_ago, hours_ago))
    assert cache(disk).save(Snapshot(KEY, TOKENS, DATA))
    assert not killed.exists() and writing.exists()


@pytest.mark.parametrize("where", ["the model's folder", "the cache folder"])
def test_a_file_where_a_folder_belongs_loses_only_the_snapshot(disk, caplog, where):
    """save() is best effort: a folder it cannot make is a log line (its clean-up raised NotADirectoryError)."""
    blocked = disk / KEY if where == "the model's folder" else disk
    blocked.parent.mkdir(parents=True, exist_ok=True)
    blocked.write_text("not a folder")
    with caplog.at_level(logging.WARNING, logger="edgespec.cache"):
        assert cache(disk).save(Snapshot(KEY, TOKENS, DATA)) is False
    assert len(warnings(caplog)) == 1 and blocked.read_text() == "not a folder"


# -- item 8: a snapshot llama.cpp refuses is deleted; the key holds what makes one unusable ----------

def load_synth(model, disk, **settings):
    from edgespec.engine.runtime import CacheSettings, Engine, ModelSettings

    settings = {"n_ctx": 512, "flash_attn": True} | settings
    return Engine.load(ModelSettings(model, **settings), cache=CacheSettings(slots=1, disk=disk))


def answer(engine, prompt):
    from edgespec.engine.events import GenerationParams

    chunks = list(engine.generate(prompt, GenerationParams(mode="plain", max_tokens=4)))
    assert sum(len(c.tokens) for c in chunks) == 4
    return chunks[-1].stats


PROMPT = [1, *range(10, 200)]


@pytest.mark.parametrize("refused", ["random state", "a q8_0 cache relabelled"])
def test_a_snapshot_llama_cpp_refuses_is_deleted_and_logged_once(synth_target, disk, caplog, refused):
    with load_synth(synth_target, disk) as engine:
        key = engine._target.pool.key
    tokens = np.asarray(PROMPT, dtype=np.int32)
    if refused == "random state":
        data = np.random.default_rng(0).bytes(4096)
    else:  # --exact's cache (Q8_0), its header's key rewritten to the F16 cache's
        with load_synth(synth_target, disk / "exact", exact=True) as engine:
            answer(engine, PROMPT)
        (made,) = (disk / "exact").glob("*/*.kv")
        raw = made.read_bytes()
        n = struct.unpack("<I", raw[8:12])[0]
        header = json.loads(raw[12:12 + n])
        tokens = np.frombuffer(raw[12 + n:12 + n + 4 * header["n_tokens"]], dtype="<i4")
        data = raw[12 + n + 4 * header["n_tokens"]:]
    path = write_file(disk / key / "refused.kv", whole_header(tokens, data, key=key), tokens, data)
    with caplog.at_level(logging.WARNING, logger="edgespec.cache"):
        with load_synth(synth_target, disk) as engine:
            stats = answer(engine, PROMPT)
            assert (stats.prompt_cache, stats.prompt_evaluated) == ("", len(PROMPT))
            assert not any(s.data == data for s in engine._cache.snapshots())
            assert not path.exists()
            engine.reset()
            answer(engine, PROMPT)  # read again, not tried again
    assert len(warnings(caplog)) == 1
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="edgespec.cache"):
        with load_synth(synth_target, disk) as engine:
            assert answer(engine, PROMPT).prompt_cache == "disk"  # the one that run wrote
    assert warnings(caplog) == []


def test_a_snapshot_too_long_for_this_context_is_kept_for_a_context_it_fits(synth_target, disk, caplog):
    long = [1, *(10 + i % 300 for i in range(600))]  # the synthetic vocabulary has 317 tokens
    with load_synth(synth_target, disk, n_ctx=1024) as engine:
        answer(engine, long)
    (kept,) = disk.glob("*/*.kv")
    with caplog.at_level(logging.WARNING, logger="edgespec.cache"):
        with load_synth(synth_target, disk, n_ctx=512) as engine:
            assert answer(engine, long[:400]).prompt_cache == ""
    assert warnings(caplog) == [] and kept.exists()
    with load_synth(synth_target, disk, n_ctx=1024) as engine:
        stats = answer(engine, long)
    assert (stats.prompt_cache, stats.prompt_evaluated) == ("disk", 1)


def test_settings_that_leave_the_cache_bytes_as_they_are_share_a_key(synth_target, disk):
    """Threads and batch size change how fast a prompt is read, not what a snapshot
    of it holds; the cache's type and layout (flash attention) do."""
    def key(**settings):
        with load_synth(synth_target, disk, **settings) as engine:
            return engine._target.pool.key

    same = key(n_threads=1, n_batch=512, n_ctx=512)
    assert key(n_threads=2, n_batch=256, n_ctx=1024) == same
    assert key(flash_attn=False) != same
    assert key(exact=True) != same  # a Q8_0 cache

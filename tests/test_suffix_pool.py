"""The suffix index over earlier text (engine/suffix.py) and its file per
tokenizer (engine/pool.py), on synthetic token streams."""

from __future__ import annotations

import errno
import logging
import multiprocessing
import os
import re
import time
from pathlib import Path

import numpy as np
import pytest

from edgespec.engine.pool import FORMAT, Pool, forget_everywhere, vocab_id
from edgespec.engine import suffix
from edgespec.engine.suffix import BYTES_PER_TOKEN, DOC_OVERHEAD, SuffixIndex
from tests.blocking import returns_without_blocking


def _random(n: int, *, seed: int, vocab: int = 32000) -> list[int]:
    return np.random.default_rng(seed).integers(0, vocab, n).tolist()


# --- matching ---------------------------------------------------------------


def test_the_continuation_of_the_longest_match_is_proposed_with_its_count():
    index = SuffixIndex()
    index.add("a", [1, 2, 3, 4, 5, 6, 7, 8, 9])
    best = index.match([50, 2, 3, 4], max_len=8)[0]
    assert best.tokens == (5, 6, 7)  # at most as long as the match: 3 tokens
    assert (best.match_len, best.count, best.occurrences, best.docs) == (3, 1, 1, ("a",))
    assert best.confidence == 1.0 and best.expected == 3.0


def test_nothing_is_proposed_without_a_match():
    index = SuffixIndex()
    index.add("a", [1, 2, 3])
    assert index.match([7, 8, 9], max_len=8) == []
    assert index.match([], max_len=8) == []
    assert index.match([1, 2], max_len=0) == []
    assert SuffixIndex().match([1, 2], max_len=8) == []


def test_a_continuation_stops_at_the_end_of_its_document():
    index = SuffixIndex()
    index.add("a", [1, 2, 3, 4, 5, 6])
    index.add("b", [7, 8, 9])
    assert index.match([3, 4, 5, 6], max_len=8) == []  # what follows is "b", another document
    assert [c.tokens for c in index.match([2, 3, 4, 5], max_len=8)] == [(6,)]


def test_matches_longer_than_three_tokens_are_followed_back():
    index = SuffixIndex()
    index.add("a", [9, 1, 2, 3, 4, 5, 10, 11, 12, 13, 14, 15])
    index.add("b", [8, 1, 2, 3, 4, 5, 20, 21])
    index.add("c", [7, 2, 3, 4, 5, 30])
    best = index.match([0, 9, 1, 2, 3, 4, 5], max_len=16)[0]
    assert best.match_len == 6 and best.tokens == (10, 11, 12, 13, 14, 15)
    assert best.docs == ("a",)


def test_counts_say_how_often_each_continuation_followed():
    index = SuffixIndex()
    for i in range(6):
        index.add(f"x{i}", [1, 2, 3, 4, 10, 11, 12, 13])
    for i in range(2):
        index.add(f"y{i}", [1, 2, 3, 4, 20, 21, 22, 23])
    first, second = index.match([1, 2, 3, 4], max_len=16)[:2]
    assert first.tokens[:4] == (10, 11, 12, 13) and first.count == 6 and first.occurrences == 8
    assert first.confidence == pytest.approx(6 / 8)
    assert second.tokens[:4] == (20, 21, 22, 23) and second.count == 2
    assert sorted(first.docs) == [f"x{i}" for i in range(6)]


def test_evidence_sets_the_length_of_a_draft():
    continuation = list(range(100, 120))
    once = SuffixIndex()
    once.add("a", [1, 2, *continuation])
    often = SuffixIndex()
    for i in range(16):
        often.add(f"d{i}", [50 + i, 1, 2, *continuation])
    weak = once.match([1, 2], max_len=32)[0]
    strong = often.match([1, 2], max_len=32)[0]
    assert len(weak.tokens) == 2  # a 2-token match seen once: 2 tokens
    assert len(strong.tokens) == 2 + 4  # seen 16 times: 4 more
    assert strong.tokens == tuple(continuation[:6])


def test_a_continuation_stops_where_its_confidence_falls_below_the_threshold():
    index = SuffixIndex()
    # after [1 2 3 4 5 6]: 7 then 8 in all ten, then 9 in three of them, 0.3
    for i in range(10):
        index.add(f"d{i}", [1, 2, 3, 4, 5, 6, 7, 8, 9 if i < 3 else 100 + i, 40, 41])
    high = index.match([1, 2, 3, 4, 5, 6], max_len=16, min_confidence=0.5)[0]
    low = index.match([1, 2, 3, 4, 5, 6], max_len=16, min_confidence=0.2)[0]
    assert high.tokens == (7, 8)
    assert low.tokens == (7, 8, 9, 40, 41) and low.confidence == pytest.approx(0.3)
    assert low.expected == pytest.approx(2 + 3 * 0.3)


def test_a_longer_match_wins_over_a_frequent_shorter_one_when_it_promises_more():
    index = SuffixIndex()
    index.add("long", [5, 6, 7, 8, 9, 1, 2, 60, 61, 62, 63, 64, 65, 66])
    for i in range(4):
        index.add(f"short{i}", [1, 2, 70, 71 + i])
    candidates = index.match([5, 6, 7, 8, 9, 1, 2], max_len=16)
    assert candidates[0].tokens == (60, 61, 62, 63, 64, 65, 66) and candidates[0].match_len == 7
    shorter = [c for c in candidates if c.match_len == 2]
    assert shorter and shorter[0].tokens[0] == 70 and shorter[0].occurrences == 5


def test_max_len_caps_every_candidate():
    index = SuffixIndex()
    index.add("a", list(range(1, 200)))
    best = index.match(list(range(1, 100)), max_len=5)[0]
    assert best.tokens == (100, 101, 102, 103, 104)


# --- documents ---------------------------------------------------------------


def test_removing_a_document_stops_its_continuations_being_proposed():
    index = SuffixIndex()
    index.add("private", [1, 2, 3, 40, 41, 42])
    index.add("other", [1, 2, 3, 50, 51, 52])
    index.match([1, 2, 3], max_len=4)  # the arrays are built, then compacted
    index.remove("private")
    candidates = index.match([1, 2, 3], max_len=4)
    assert [c.tokens for c in candidates] == [(50, 51, 52)]
    assert "private" not in index and index.n_tokens == 6
    index.remove("other")
    assert index.match([1, 2, 3], max_len=4) == [] and index.n_tokens == 0


def test_adding_a_document_again_replaces_its_tokens():
    index = SuffixIndex()
    index.add("chat", [1, 2, 3, 4])
    index.match([1], max_len=4)
    index.add("chat", [1, 2, 3, 4, 5, 6, 7])
    assert index.n_tokens == 7 and len(index) == 1
    assert index.match([2, 3, 4, 5], max_len=4)[0].tokens == (6, 7)
    assert index.tokens("chat").tolist() == [1, 2, 3, 4, 5, 6, 7]


def test_adding_the_same_tokens_again_only_marks_the_document_used():
    index = SuffixIndex()
    index.add("a", [1, 2, 3])
    index.add("b", [4, 5, 6])
    index.match([1], max_len=1)
    index.add("a", [1, 2, 3])
    assert index.documents() == ["b", "a"] and index.n_tokens == 6
    assert index.match([1, 2], max_len=2)[0].tokens == (3,)


def test_a_conversation_grows_at_the_end_of_its_document():
    index = SuffixIndex()
    index.add("old", [9, 9, 9])
    index.add("chat", [1, 2, 3])
    index.match([1], max_len=1)
    index.extend("chat", [4, 5])
    index.add("chat", [1, 2, 3, 4, 5, 6, 7])  # its tokens so far: only 6 and 7 are new
    assert index.tokens("chat").tolist() == [1, 2, 3, 4, 5, 6, 7] and index.n_tokens == 10
    assert index.match([2, 3, 4, 5], max_len=4)[0].tokens == (6, 7)  # across what was added when
    index.extend("old", [8])  # not the last document: stored again at the end
    assert index.tokens("old").tolist() == [9, 9, 9, 8]
    assert index.match([9, 9], max_len=2)[0].tokens == (9, 8)
    assert index.match([2, 3], max_len=2)[0].tokens == (4, 5)
    index.extend("new", [30, 31])
    assert index.documents()[-1] == "new" and index.tokens("new").tolist() == [30, 31]


def _reference_longest(docs: dict[str, list[int]], history: list[int], max_match: int) -> tuple[int, list[bool]]:
    """The longest match by brute force, and for each place it occurs, whether a token follows it there."""
    best, followed = 0, []
    for tokens in docs.values():
        for p in range(len(tokens)):
            n = 0
            while n < min(max_match, len(history)) and p - n >= 0 and tokens[p - n] == history[-1 - n]:
                n += 1
            if n > best:
                best, followed = n, []
            if n == best and n:
                followed.append(p + 1 < len(tokens))
    return best, followed


@pytest.mark.parametrize("tail_min", [0, 8192], ids=["sorted", "scanned"])
def test_the_longest_match_agrees_with_brute_force(monkeypatch, tail_min):
    monkeypatch.setattr(suffix, "_TAIL_MIN", tail_min)
    rng = np.random.default_rng(7)
    index = SuffixIndex()
    docs: dict[str, list[int]] = {}
    for step in range(80):
        name = f"d{rng.integers(0, 8)}"
        roll = rng.random()
        if roll < 0.2 and name in docs:
            index.remove(name)
            del docs[name]
        elif roll < 0.5 and name in docs:
            more = rng.integers(0, 6, rng.integers(0, 20)).tolist()
            index.extend(name, more)
            docs[name] = docs[name] + more
        else:
            docs[name] = rng.integers(0, 6, rng.integers(1, 60)).tolist()
            index.add(name, docs[name])
        if step % 7 == 0:
            index.prepare()  # all sorted in, whatever the thresholds
        history = rng.integers(0, 6, 12).tolist()
        length, followed = _reference_longest(docs, history, 8)
        found = index.match(history, max_len=4, max_match=8, min_confidence=0.0, limit=1)
        if any(followed):
            assert (found[0].match_len, found[0].occurrences) == (length, len(followed))
        else:  # no match, or only at the ends of documents
            assert found == []


def test_documents_are_evicted_least_recently_used_first_at_the_budget():
    doc = 100
    index = SuffixIndex(budget_bytes=3 * ((doc + 1) * BYTES_PER_TOKEN + DOC_OVERHEAD))
    for name in ("a", "b", "c"):
        index.add(name, _random(doc, seed=ord(name)))
    index.touch("a")
    evicted = index.add("d", _random(doc, seed=4))
    assert evicted == ["b"]
    assert index.documents() == ["c", "a", "d"]
    assert index.nbytes <= index.budget_bytes
    assert index.match(_random(doc, seed=ord("b"))[:10], max_len=4) == []
    assert index.match(_random(doc, seed=ord("a"))[:10], max_len=4)[0].docs == ("a",)


def test_a_document_larger_than_the_budget_keeps_its_last_tokens():
    index = SuffixIndex(budget_bytes=DOC_OVERHEAD + 11 * BYTES_PER_TOKEN)
    index.add("big", list(range(1, 101)))
    assert index.tokens("big").tolist() == list(range(91, 101))
    assert SuffixIndex(budget_bytes=0).add("x", [1, 2, 3]) == []


def test_many_additions_and_removals_keep_the_index_consistent():
    index = SuffixIndex()
    rng = np.random.default_rng(0)
    kept: dict[str, list[int]] = {}
    for step in range(60):
        name = f"d{rng.integers(0, 12)}"
        if rng.random() < 0.3 and name in kept:
            index.remove(name)
            del kept[name]
        else:
            kept[name] = rng.integers(0, 50, rng.integers(1, 300)).tolist()
            index.add(name, kept[name])
        if step % 3 == 0:
            index.match([1, 2, 3], max_len=4)
    for name, tokens in kept.items():
        assert index.tokens(name).tolist() == tokens
        probe = tokens[:8]
        if len(tokens) > 8:
            best = index.match(probe, max_len=1, max_match=8)
            assert any(name in c.docs for c in best)


def test_a_conversation_of_100k_tokens_continues_where_it_was_left():
    rng = np.random.default_rng(5)
    conversation = _text_like(100_000, rng)
    index = SuffixIndex()
    index.add("chat:1", conversation)
    best = index.match(conversation[:60_000], max_len=16)[0]
    assert best.tokens == tuple(conversation[60_000:60_016]) and best.match_len == 64


def test_bad_tokens_are_refused():
    index = SuffixIndex()
    with pytest.raises(ValueError):
        index.add("a", [1, -2, 3])
    with pytest.raises(ValueError):
        index.add("a", [1, 1 << 22])
    assert index.match([1, -5, 1 << 40], max_len=4) == []


def _text_like(n: int, rng: np.random.Generator, vocab: int = 50000) -> list[int]:
    """Zipf-distributed tokens, as words are: a few very common, most rare."""
    return (np.minimum(rng.zipf(1.2, n), vocab) - 1).tolist()


def test_match_time_on_a_100k_token_pool(capsys):
    rng = np.random.default_rng(1)
    index = SuffixIndex()
    replies: list[list[int]] = []
    started = time.process_time()
    for d in range(100):  # 100 replies of 1000 tokens, each quoting earlier ones in places
        tokens = _text_like(1000, rng)
        for _ in range(6 if replies else 0):
            source = replies[rng.integers(0, len(replies))]
            at, to = rng.integers(0, 950), rng.integers(0, 950)
            tokens[to:to + 50] = source[at:at + 50]
        replies.append(tokens)
        index.add(f"reply{d}", tokens)
        if d % 10 == 9:
            index.match(tokens[:50], max_len=8)  # stored as it goes: merged, or sorted again
    built = time.process_time() - started
    fresh = [_text_like(300, rng) for _ in range(200)]
    quoting = [_text_like(200, rng) + replies[i][100:100 + rng.integers(1, 100)] for i in range(100)] * 2
    cpu = {}
    for name, histories in (("new text", fresh), ("text quoting the pool", quoting)):
        times = []
        for history in histories:
            t = time.process_time()
            index.match(history, max_len=16)
            times.append(time.process_time() - t)
        cpu[name] = np.array(times) * 1e6
    with capsys.disabled():
        print(f"\n100k-token pool: built in {built * 1e3:.0f} ms CPU, {index.nbytes / 2**20:.1f} MiB")
        for name, us in cpu.items():
            print(f"  match after {name}: CPU median {np.median(us):.0f} us, p90 {np.percentile(us, 90):.0f} us, "
                  f"max {us.max():.0f} us")
    assert index.n_tokens == 100_000


# --- the pool file ---------------------------------------------------------------

VOCAB = "0123456789abcdef0123456789abcdef"
OTHER_VOCAB = "fedcba9876543210fedcba9876543210"
POOL_LOG = "edgespec.cache"


def _pool_warnings(caplog) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == POOL_LOG and r.levelno == logging.WARNING]


def _saved_pool(folder: Path) -> Path:
    pool = Pool.open(folder, VOCAB)
    pool.add("chat:1", [1, 2, 3, 4, 5, 6])
    pool.add("file:abc", list(range(100, 140)))
    assert pool.save()
    return pool.path


def test_a_pool_is_kept_across_restarts(tmp_path, caplog):
    caplog.set_level(logging.WARNING)
    pool = Pool.open(tmp_path / "pool", VOCAB)
    assert pool.index.n_tokens == 0 and pool.path == tmp_path / "pool" / f"{VOCAB}.pool"
    pool.add("chat:1", [1, 2, 3, 4, 5, 6])
    pool.add("file:abc", list(range(100, 140)))
    pool.touch("chat:1")
    pool.extend("chat:1", [7, 8])
    assert pool.save()
    again = Pool.open(tmp_path / "pool", VOCAB)
    assert again.index.documents() == ["file:abc", "chat:1"]
    assert again.index.tokens("chat:1").tolist() == [1, 2, 3, 4, 5, 6, 7, 8]
    assert again.index.tokens("file:abc").tolist() == list(range(100, 140))
    assert again.index.last_used("chat:1") == pool.index.last_used("chat:1")
    assert again.index.match([3, 4, 5], max_len=4)[0].tokens == (6, 7, 8)
    assert _pool_warnings(caplog) == []


def test_a_pool_over_a_smaller_budget_keeps_its_most_recent_documents(tmp_path):
    pool = Pool.open(tmp_path, VOCAB)
    for i in range(5):
        pool.add(f"d{i}", _random(100, seed=i))
    pool.save()
    small = Pool.open(tmp_path, VOCAB, budget_bytes=2 * (101 * BYTES_PER_TOKEN + DOC_OVERHEAD))
    assert small.index.documents() == ["d3", "d4"]


def test_forgetting_a_document_removes_its_tokens_from_the_file(tmp_path):
    path = _saved_pool(tmp_path)
    pool = Pool.open(tmp_path, VOCAB)
    assert pool.forget("chat:1")
    assert np.array([1, 2, 3, 4, 5, 6], dtype="<i4").tobytes() not in path.read_bytes()
    again = Pool.open(tmp_path, VOCAB)
    assert again.index.documents() == ["file:abc"]
    assert again.index.match([2, 3, 4], max_len=4) == []


def test_a_document_forgotten_by_one_process_is_not_written_back_by_another(tmp_path):
    _saved_pool(tmp_path)
    app, server = Pool.open(tmp_path, VOCAB), Pool.open(tmp_path, VOCAB)
    app.forget("chat:1")
    server.add("request:9", [7, 8, 9])
    assert server.save()
    final = Pool.open(tmp_path, VOCAB)
    assert sorted(final.index.documents()) == ["file:abc", "request:9"]
    assert "chat:1" not in server.index


def test_a_document_is_forgotten_in_the_pools_of_every_vocabulary(tmp_path):
    for vocab in (VOCAB, OTHER_VOCAB):
        pool = Pool.open(tmp_path, vocab)
        pool.add("chat:1", [1, 2, 3])
        pool.add("chat:2", [4, 5, 6])
        pool.save()
    server = Pool.open(tmp_path, VOCAB)
    server.add("chat:3", [7, 8, 9])  # not saved yet when the conversation is deleted
    assert forget_everywhere(tmp_path, "chat:1") and forget_everywhere(tmp_path, "chat:3")
    for vocab in (VOCAB, OTHER_VOCAB):
        assert Pool.open(tmp_path, vocab).index.documents() == ["chat:2"]
    server.save()
    assert Pool.open(tmp_path, VOCAB).index.documents() == ["chat:2"]


def test_a_document_added_again_after_it_was_forgotten_is_kept(tmp_path):
    pool = Pool.open(tmp_path, VOCAB)
    pool.add("chat:1", [1, 2, 3])
    pool.forget("chat:1")
    pool.add("chat:1", [4, 5, 6])
    pool.save()
    assert Pool.open(tmp_path, VOCAB).index.tokens("chat:1").tolist() == [4, 5, 6]


def _damage(path: Path, how: str) -> None:
    data = path.read_bytes()
    if how == "truncated":
        path.write_bytes(data[: len(data) - 9])
    elif how == "flipped":
        path.write_bytes(data[:-20] + bytes([data[-20] ^ 0xFF]) + data[-19:])
    elif how == "header":
        path.write_bytes(data[:16] + b"{not json" + data[25:])
    elif how == "counts":  # a header claiming more tokens than the file holds
        path.write_bytes(data.replace(b'"chat:1", 6,', b'"chat:1", 600000000000,'))
    elif how == "garbage":
        path.write_bytes(b"\x00" * 3)
    elif how == "version":
        path.write_bytes(data[:8] + (FORMAT + 1).to_bytes(4, "little") + data[12:])
    elif how == "nested":  # a header nested past json's limit, in place of the real one
        nested, header_end = b"[" * 100_000, 16 + int.from_bytes(data[12:16], "little")
        path.write_bytes(data[:12] + len(nested).to_bytes(4, "little") + nested + data[header_end:])


@pytest.mark.parametrize("how", ["truncated", "flipped", "header", "counts", "garbage", "version", "nested"])
def test_an_unusable_pool_file_is_dropped_with_a_log_line(tmp_path, caplog, how):
    path = _saved_pool(tmp_path)
    _damage(path, how)
    caplog.set_level(logging.WARNING)
    pool = Pool.open(tmp_path, VOCAB)
    assert pool.index.n_tokens == 0
    assert len(_pool_warnings(caplog)) == 1
    pool.add("new", [1, 2, 3])
    assert pool.save()  # the unusable file is replaced
    assert Pool.open(tmp_path, VOCAB).index.documents() == ["new"]


def test_a_fifo_named_as_the_pool_file_does_not_block_the_load(tmp_path, caplog):
    """Only a regular file is read: a FIFO in its place blocked the open until a writer came (a hung load)."""

    fifo = tmp_path / f"{VOCAB}.pool"
    os.mkfifo(fifo)
    with caplog.at_level(logging.WARNING):
        pool = returns_without_blocking(fifo, lambda: Pool.open(tmp_path, VOCAB))
    assert pool.index.n_tokens == 0
    assert len(_pool_warnings(caplog)) == 1


def test_a_pool_of_another_vocabulary_is_never_used(tmp_path, caplog):
    path = _saved_pool(tmp_path)
    path.rename(tmp_path / f"{OTHER_VOCAB}.pool")
    caplog.set_level(logging.WARNING)
    assert Pool.open(tmp_path, OTHER_VOCAB).index.n_tokens == 0
    assert len(_pool_warnings(caplog)) == 1
    assert Pool.open(tmp_path, VOCAB).index.n_tokens == 0  # no file of its own yet: nothing to say


def test_a_full_disk_keeps_the_old_file(tmp_path, caplog, monkeypatch):
    path = _saved_pool(tmp_path)
    before = path.read_bytes()
    pool = Pool.open(tmp_path, VOCAB)
    pool.add("chat:2", list(range(7, 70)))

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    caplog.set_level(logging.WARNING)
    monkeypatch.setattr(os, "replace", full)
    assert pool.save() is False
    assert len(_pool_warnings(caplog)) == 1
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []
    monkeypatch.undo()
    assert pool.save()
    assert "chat:2" in Pool.open(tmp_path, VOCAB).index


def test_a_save_cut_short_by_a_kill_leaves_no_file_past_the_next_save(tmp_path):
    """SIGKILL while the pool is written leaves its temporary file: the next save deletes
    one that old, and leaves one still being written by another process."""
    killed = tmp_path / f".{VOCAB}.pool.99999.tmp"
    writing = tmp_path / f".{OTHER_VOCAB}.pool.99998.tmp"
    for path in (killed, writing):
        path.write_bytes(b"x" * 1000)
    hours_ago = time.time() - 2 * 3600
    os.utime(killed, (hours_ago, hours_ago))
    _saved_pool(tmp_path)
    assert not killed.exists() and writing.exists()


def test_a_failed_write_keeps_the_old_file(tmp_path, caplog, monkeypatch):
    path = _saved_pool(tmp_path)
    before = path.read_bytes()
    pool = Pool.open(tmp_path, VOCAB)
    pool.add("chat:2", [1, 2])
    monkeypatch.setattr(os, "fsync", lambda fd: (_ for _ in ()).throw(OSError(errno.ENOSPC, "full")))
    caplog.set_level(logging.WARNING)
    assert pool.save() is False and len(_pool_warnings(caplog)) == 1
    assert path.read_bytes() == before


def test_a_folder_that_cannot_be_created_leaves_a_pool_in_memory(tmp_path, caplog):
    (tmp_path / "file").write_text("")
    caplog.set_level(logging.WARNING)
    pool = Pool.open(tmp_path / "file" / "pool", VOCAB)
    pool.add("a", [1, 2, 3])
    assert pool.index.match([1, 2], max_len=2)[0].tokens == (3,)
    assert pool.save() is False
    assert len(_pool_warnings(caplog)) >= 2


def test_a_vocabulary_id_is_checked():
    with pytest.raises(ValueError):
        Pool.open(Path("/nonexistent"), "../etc")


def _add_in_another_process(folder: str, doc: str, tokens: list[int], both_open) -> None:
    pool = Pool.open(Path(folder), VOCAB)
    both_open.wait(timeout=60)  # each has read the file before either writes it
    pool.add(doc, tokens)
    if not pool.save():
        raise SystemExit(1)


def test_two_processes_adding_at_once_keep_both_documents(tmp_path):
    _saved_pool(tmp_path)
    context = multiprocessing.get_context("spawn")
    both_open = context.Barrier(2)
    workers = [context.Process(target=_add_in_another_process,
                               args=(str(tmp_path), f"proc{i}", _random(500, seed=i), both_open))
               for i in range(2)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=120)
    assert [w.exitcode for w in workers] == [0, 0]
    pool = Pool.open(tmp_path, VOCAB)
    assert sorted(pool.index.documents()) == ["chat:1", "file:abc", "proc0", "proc1"]
    assert pool.index.tokens("proc1").tolist() == _random(500, seed=1)


def test_the_vocabulary_id_names_the_tokenizer(synth_target, synth_far_draft, synth_other_vocab):
    from edgespec.engine.runtime import vocab_info
    from edgespec.llama.model import LlamaModel
    from edgespec.models.gguf_header import read_vocab_info

    target = vocab_id(read_vocab_info(synth_target))
    assert _VOCAB_ID_FORMAT.fullmatch(target)
    assert vocab_id(read_vocab_info(synth_far_draft)) == target  # same vocabulary, other weights
    assert vocab_id(read_vocab_info(synth_other_vocab)) != target
    model = LlamaModel(synth_target, vocab_only=True)
    try:
        assert vocab_id(vocab_info(model)) == target  # a loaded model and its header agree
    finally:
        model.close()


_VOCAB_ID_FORMAT = re.compile(r"[0-9a-f]{32}")


def test_a_pool_keeps_only_token_ids_of_its_vocabulary(tmp_path, caplog):
    """A pool for a vocabulary of n tokens refuses ids from n on, and a file that holds
    such a document (an earlier version took a request's token ids unchecked) opens
    without it, the other documents kept: proposed as a draft, it would fail the decode."""
    caplog.set_level(logging.WARNING)
    loose = Pool.open(tmp_path, VOCAB)
    loose.add("request:bad", [1, 2, 3, 150, 4])
    loose.add("chat:1", [1, 2, 3, 99, 4])
    assert loose.save()
    pool = Pool.open(tmp_path, VOCAB, vocab_size=100)
    assert pool.index.documents() == ["chat:1"]
    assert any("token ids" in r.getMessage() for r in _pool_warnings(caplog))
    with pytest.raises(ValueError, match="vocabulary"):
        pool.add("request:worse", [1, 100])
    with pytest.raises(ValueError, match="vocabulary"):
        pool.extend("chat:1", [100])
    assert pool.index.tokens("chat:1").tolist() == [1, 2, 3, 99, 4]
    pool.touch("chat:1")
    assert pool.save()  # merging the file again drops the bad document again
    assert Pool.open(tmp_path, VOCAB).index.documents() == ["chat:1"]

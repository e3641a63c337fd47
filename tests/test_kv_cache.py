"""Several conversations in the KV caches, and their snapshots in RAM and on disk,
on a real model (SmolLM2-135M): coming back to a conversation reads only its
new tokens, whatever was read in between, and never changes the output."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from edgespec.chat.template import chat_template
from edgespec.engine.events import GenerationParams
from edgespec.engine.runtime import CacheSettings, Engine, ModelSettings
from edgespec.engine.snapshots import Snapshot, SnapshotCache

pytestmark = pytest.mark.slow

TOPICS = ["the history of the bicycle", "how bread is baked", "the life of honey bees", "the rules of chess"]


def conversation(engine, topic: str, turns: int = 1) -> list[int]:
    """A long-ish chat prompt (~300 tokens per turn) about `topic`."""
    messages = []
    for i in range(turns):
        messages.append({"role": "user", "content": f"Tell me about {topic}, part {i}. " + f"Some notes on {topic}: "
                         + " ".join(f"point {j} about {topic} is worth a sentence." for j in range(30))})
        messages.append({"role": "assistant", "content": f"Here is part {i} about {topic}. " * 8})
    messages.append({"role": "user", "content": f"Summarise {topic} in one line."})
    return engine.tokenize(chat_template(engine).render(messages), special=True)


def reply(engine, tokens, **kw):
    kw.setdefault("mode", "plain")
    kw.setdefault("max_tokens", 8)
    out, last = [], None
    for last in engine.generate(tokens, GenerationParams(**kw)):
        out += last.tokens
    return out, last.stats


def load(model, *, draft=None, exact=False, n_ctx=2048, **cache):
    return Engine.load(ModelSettings(model, n_ctx=n_ctx, exact=exact),
                       ModelSettings(draft, n_ctx=n_ctx) if draft else None, cache=CacheSettings(**cache))


def test_a_b_then_a_again_reads_only_the_new_tokens_of_a(smollm2):
    with load(smollm2, draft=smollm2, slots=2, ram_mib=0) as engine:
        a, b = conversation(engine, TOPICS[0]), conversation(engine, TOPICS[1])
        out_a, _ = reply(engine, a, mode="draft")
        reply(engine, b, mode="draft")
        a2 = a + out_a + engine.tokenize("\nAnd in two lines?", special=True)
        before = engine.target_seq.ctx.decoded, engine.draft_seq.ctx.decoded
        _, stats = reply(engine, a2, mode="draft")
        assert stats.prompt_cache == "sequence"
        # the new message and the prompt's last token (read again for its logits), nothing more
        assert stats.prompt_evaluated == len(a2) - len(a) - len(out_a) + 1
        assert stats.prompt_cached == len(a) + len(out_a) - 1
        # the target's passes: the new tokens and one a cycle; the draft model's: the new tokens
        # (its sequence held conversation A) and its drafts, nothing near the length of A again
        target_read, draft_read = engine.target_seq.ctx.decoded - before[0], engine.draft_seq.ctx.decoded - before[1]
        assert target_read < stats.prompt_evaluated + 8 * stats.target_passes
        assert draft_read < stats.prompt_evaluated + 8 * stats.target_passes < len(a) // 2


def test_a_conversation_evicted_from_the_cache_comes_back_from_ram(smollm2):
    with load(smollm2, slots=1, ram_mib=64) as engine:
        a, b = conversation(engine, TOPICS[0]), conversation(engine, TOPICS[1])
        fresh_a, _ = reply(engine, a)
        reply(engine, b)  # one sequence: A goes to RAM
        out, stats = reply(engine, a)
        assert stats.prompt_cache == "ram"
        assert stats.prompt_evaluated == 1  # the last token, for its logits
        assert out == fresh_a


def test_a_conversation_evicted_by_a_short_prompt_comes_back_from_ram_too(smollm2):
    """A short prompt (fewer new tokens than are worth looking for in snapshots)
    still keeps what it makes the sequence give up."""
    with load(smollm2, slots=1, ram_mib=64) as engine:
        a = conversation(engine, TOPICS[0])
        fresh_a, _ = reply(engine, a)
        short = engine.tokenize(chat_template(engine).render([{"role": "user", "content": "Hi!"}]), special=True)
        reply(engine, short)
        out, stats = reply(engine, a)
        assert stats.prompt_cache == "ram" and stats.prompt_evaluated == 1
        assert out == fresh_a


def test_a_tiny_ram_budget_is_never_exceeded_and_the_output_stays_the_same(smollm2):
    with load(smollm2, slots=1, ram_mib=1) as engine:
        cache = engine._cache
        budget = cache.ram_bytes
        prompts = [conversation(engine, t) for t in TOPICS]
        first = [reply(engine, p)[0] for p in prompts]
        seen_ram = 0
        for p, want in zip(prompts * 2, first * 2):
            out, stats = reply(engine, p)
            assert out == want
            assert cache.ram_used <= budget
            seen_ram += stats.prompt_cache == "ram"
        # a snapshot of ~300 SmolLM2 tokens is ~7 MB: it never fits in 1 MiB, so nothing comes from RAM
        assert seen_ram == 0


def test_ram_snapshots_go_least_recently_used_first():
    cache = SnapshotCache(ram_bytes=3000)
    snaps = [Snapshot("k", np.arange(i * 100, i * 100 + 10, dtype=np.int32), b"x" * 960) for i in range(4)]
    for s in snaps[:3]:
        assert cache.keep(s)
    assert cache.find("k", snaps[0].tokens.tolist(), more_than=0).snapshot is snaps[0]  # used: now the newest
    cache.keep(snaps[3])
    assert cache.snapshots() == [snaps[2], snaps[0], snaps[3]] and cache.ram_used <= 3000
    assert cache.find("other key", snaps[0].tokens.tolist(), more_than=0) is None
    # one that extends another replaces it; one that another extends is not kept twice
    longer = Snapshot("k", np.arange(300, 320, dtype=np.int32), b"y" * 100)
    cache.keep(longer)
    assert snaps[3] not in cache.snapshots()
    cache.keep(Snapshot("k", np.arange(300, 305, dtype=np.int32), b"z"))
    assert cache.snapshots()[-1] is longer


RESTART = textwrap.dedent("""
    import json, sys
    from edgespec.chat.template import chat_template
    from edgespec.engine.events import GenerationParams
    from edgespec.engine.runtime import CacheSettings, Engine, ModelSettings
    model, disk, exact, prompt = sys.argv[1], sys.argv[2], sys.argv[3] == "1", json.loads(sys.argv[4])
    with Engine.load(ModelSettings(model, n_ctx=2048, exact=exact),
                     cache=CacheSettings(slots=2, disk=disk)) as engine:
        out = []
        for chunk in engine.generate(prompt, GenerationParams(mode="plain", max_tokens=12)):
            out += chunk.tokens
        print(json.dumps({"out": out, "cache": chunk.stats.prompt_cache,
                          "evaluated": chunk.stats.prompt_evaluated}))
""")


def run_process(model, disk, prompt, *, exact=False) -> dict:
    done = subprocess.run([sys.executable, "-c", RESTART, str(model), str(disk), "1" if exact else "0",
                           json.dumps(prompt)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_disk_snapshot_outlives_the_process_and_is_exact(smollm2, tmp_path):
    disk = tmp_path / "kv"
    with load(smollm2, exact=True, slots=1, ram_mib=0) as engine:
        prompt = conversation(engine, TOPICS[2], turns=2)
    first = run_process(smollm2, disk, prompt, exact=True)
    assert first["cache"] == "" and first["evaluated"] == len(prompt)
    assert list(disk.glob("*/*.kv")), "closing the engine writes what its cache holds"
    again = run_process(smollm2, disk, prompt, exact=True)
    assert again["cache"] == "disk" and again["evaluated"] == 1
    assert again["out"] == first["out"]  # under exact kernels, token for token a fresh read's reply
    # other cache settings (here: not exact) make another key: the snapshot is not used
    other = run_process(smollm2, disk, prompt, exact=False)
    assert other["cache"] == "" and other["evaluated"] == len(prompt)


@pytest.mark.qwen
def test_under_exact_a_conversation_continued_or_reopened_answers_as_plain_decoding(qwen_pair):
    """--exact's promise, on the bundled pair (where a fresh read of a conversation's
    text does not give the KV its replies left, decoded a token or a draft at a time):
    greedy speculation over a two-turn conversation is plain greedy decoding of the
    same conversation read the same way, token for token; and a turn answered again
    after the conversation came back from a snapshot is the same reply."""
    _, target, draft = qwen_pair
    with load(target, draft=draft, exact=True, n_ctx=1024, slots=1, ram_mib=64) as engine:
        def user(text: str, *, first: bool = False) -> list[int]:  # the pair's chat format (ChatML)
            head = "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n" if first else "<|im_end|>\n"
            return engine.tokenize(f"{head}<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n")

        first = user("Write a Python function that checks whether a number is prime, with a docstring, "
                     "type hints and a short example of its use in a doctest. Keep it under twenty lines.", first=True)
        follow = user("Now make it faster for large numbers.")

        def two_turns(mode: str) -> tuple[list[int], list[int]]:
            one, _ = reply(engine, first, mode=mode, max_tokens=16)
            two, stats = reply(engine, first + one + follow, mode=mode, max_tokens=16)
            assert stats.prompt_cache == "sequence"  # the conversation went on in its cache
            return one, two

        speculated = two_turns("draft")
        engine.reset()
        assert two_turns("plain") == speculated
        second = first + speculated[0] + follow
        other = user("What is a closure in JavaScript? Explain lexical scope, private state in the module pattern, "
                     "and the classic loop pitfall with var and setTimeout, in three sentences.", first=True)
        reply(engine, other, max_tokens=1)  # one sequence: the conversation goes to a RAM snapshot
        again, stats = reply(engine, second, max_tokens=16)  # its snapshot, then the prompt's last token
        assert stats.prompt_cache == "ram"
        assert again == speculated[1]


@pytest.mark.qwen
def test_under_exact_a_prompt_read_afresh_or_again_gives_the_same_first_logits(qwen_pair, monkeypatch):
    """A prompt whose tokens are all cached reads its last token again, alone, for its
    logits; on the bundled target a batch's last row differs from that by ~0.4 (the
    batch kernels), so under --exact a fresh read takes its last token alone too."""
    _, target, _ = qwen_pair
    with load(target, exact=True, n_ctx=512, slots=1, ram_mib=0) as engine:
        seq, first_logits = engine.target_seq, []
        read = seq.logits
        monkeypatch.setattr(seq, "logits", lambda i: first_logits.append(read(i).copy()) or first_logits[-1])
        prompt = engine.tokenize("<|im_start|>user\nWrite a Python function that checks whether a number is prime."
                                 "<|im_end|>\n<|im_start|>assistant\n")
        _, fresh = reply(engine, prompt, max_tokens=1)
        _, again = reply(engine, prompt, max_tokens=1)
        assert (fresh.prompt_cache, again.prompt_cache) == ("", "sequence")
        assert len(first_logits) == 2 and np.array_equal(first_logits[0], first_logits[1])


def test_a_snapshot_for_another_prefix_or_model_is_not_used(smollm2, synth_target, tmp_path):
    disk = tmp_path / "kv"
    with load(smollm2, slots=1, ram_mib=16, disk=disk) as engine:
        a = conversation(engine, TOPICS[0])
        reply(engine, a)
    with load(smollm2, slots=1, ram_mib=16, disk=disk) as engine:
        b = conversation(engine, TOPICS[3])
        shared = next(i for i, (x, y) in enumerate(zip(a, b)) if x != y)
        _, stats = reply(engine, b)  # shares only the template's opening with A: read
        assert stats.prompt_cache == "" and stats.prompt_evaluated == len(b)
        assert shared < 32
    with load(synth_target, slots=1, ram_mib=16, disk=disk, n_ctx=512) as engine:
        _, stats = reply(engine, [1, *range(10, 200)])
        assert stats.prompt_cache == ""


@pytest.mark.parametrize("damage", ["truncate", "flip", "garbage"])
def test_a_damaged_snapshot_file_is_read_over_with_a_line_in_the_log(smollm2, tmp_path, caplog, damage):
    disk = tmp_path / "kv"
    with load(smollm2, slots=1, ram_mib=16, disk=disk) as engine:
        prompt = conversation(engine, TOPICS[1])
        want, _ = reply(engine, prompt)
    (path,) = disk.glob("*/*.kv")
    data = bytearray(path.read_bytes())
    if damage == "truncate":
        data = data[: len(data) // 2]
    elif damage == "flip":
        data[-100] ^= 0xFF
    else:
        data[:16] = b"not a snapshot!!"
    path.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING, logger="edgespec.cache"):
        with load(smollm2, slots=1, ram_mib=16, disk=disk) as engine:
            out, stats = reply(engine, prompt)
    assert stats.prompt_cache == "" and stats.prompt_evaluated == len(prompt)
    assert out == want
    assert any("ignoring KV snapshot" in r.getMessage() for r in caplog.records)


def test_a_full_disk_loses_the_snapshot_only(smollm2, tmp_path, caplog, monkeypatch):
    import builtins

    disk = tmp_path / "kv"
    real_open = builtins.open

    def full_open(file, mode="r", *args, **kw):
        f = real_open(file, mode, *args, **kw)
        if "w" in mode and str(file).endswith(".tmp"):
            def write(_data):
                raise OSError(28, "No space left on device")
            f.write = write
        return f

    with load(smollm2, slots=1, ram_mib=16, disk=disk) as engine:
        prompt = conversation(engine, TOPICS[0])
        want, _ = reply(engine, prompt)
        monkeypatch.setattr(builtins, "open", full_open)
        with caplog.at_level(logging.WARNING, logger="edgespec.cache"):
            engine.close()
        monkeypatch.undo()
    assert not list(disk.rglob("*.kv")) and not list(disk.rglob("*.tmp"))
    assert any("No space left" in r.getMessage() for r in caplog.records)
    with load(smollm2, slots=1, ram_mib=16, disk=disk) as engine:
        assert reply(engine, prompt)[0] == want


def test_the_disk_budget_keeps_the_most_recently_used(tmp_path):
    cache = SnapshotCache(ram_bytes=0, disk=tmp_path, disk_bytes=5000)
    snaps = [Snapshot("k", np.arange(i * 100, i * 100 + 10, dtype=np.int32), bytes([i]) * 2000) for i in range(3)]
    for s in snaps:
        assert cache.save(s)
    files = list(tmp_path.glob("*/*.kv"))
    assert len(files) == 2 and sum(f.stat().st_size for f in files) <= 5000
    fresh = SnapshotCache(ram_bytes=1 << 20, disk=tmp_path, disk_bytes=5000)
    assert fresh.find("k", snaps[0].tokens.tolist(), more_than=0) is None
    found = fresh.find("k", snaps[2].tokens.tolist() + [7], more_than=0)
    assert found.source == "disk" and found.snapshot.data == snaps[2].data and found.shared == 10


async def test_the_app_switches_between_two_chats_without_reading_them_again(smollm2, tmp_path):
    from edgespec.chat.store import ConversationStore, Message
    from edgespec.tui.chat_settings import ChatSettings
    from edgespec.tui.widgets.sidebar import ConversationList
    from tests.app_helpers import boxes, make_app, read_ahead_done, send, wait_for

    engines = []

    def load(choice, settings, progress=None):
        engines.append(Engine.load(ModelSettings(smollm2, n_ctx=2048), cache=CacheSettings(slots=2, ram_mib=0)))
        return engines[-1]

    with ConversationStore(tmp_path / "chats.db") as store:
        ids = []
        for topic in TOPICS[:2]:
            ids.append(store.create(title=topic))
            store.append(ids[-1], Message("user", " ".join(f"Point {i} about {topic} is worth a sentence."
                                                           for i in range(40))))
            store.append(ids[-1], Message("assistant", f"Noted, all about {topic}."))
        app = make_app(store, load=load, defaults=ChatSettings(mode="plain", max_tokens=8))
        async with app.run_test(size=(110, 36)) as pilot:
            await wait_for(pilot, lambda: app.model_state == "ready", timeout=60)

            async def turn(cid: int, text: str) -> dict:
                if app.chat.conversation_id != cid:
                    app.query_one(ConversationList).post_message(ConversationList.Selected(cid))
                    await wait_for(pilot, lambda: app.chat.conversation_id == cid)
                shown = len(store.messages(cid))
                await wait_for(pilot, lambda: len(boxes(app)) == shown)
                await send(pilot, text, key=False)

                def replied() -> bool:
                    messages = store.messages(cid)
                    return len(messages) == shown + 2 and messages[-1].status == "done" and not app.chat.generating

                await wait_for(pilot, replied, timeout=60)
                return store.messages(cid)[-1].stats

            assert (await turn(ids[0], "Summarise.")).prompt_cache == ""  # read once
            assert (await turn(ids[1], "Summarise.")).prompt_cache == ""
            await read_ahead_done(pilot)
            decoded = engines[0].target_seq.ctx.decoded
            stats = await turn(ids[0], "Shorter, please.")
            assert stats.prompt_cache == "sequence" and stats.prompt_evaluated < 20, stats
            assert stats.prompt_cached > 400
            await read_ahead_done(pilot)
            # the new message, at most 8 single-token passes, and the next turn's head read
            # ahead once the reply ended (the end of the turn, the user's): nothing of either chat read again
            assert engines[0].target_seq.ctx.decoded - decoded < 20 + 8 + 10


def test_auto_calibrates_once_per_machine_and_models_not_once_per_process(smollm2, tmp_path, monkeypatch):
    """A one-shot `chat` or `generate` would otherwise measure its passes before every
    reply; the calibration is kept beside the snapshots, and a damaged one measured again."""
    import edgespec.engine.choice as choice

    disk = tmp_path / "kv"
    with load(smollm2, slots=1, ram_mib=16, disk=disk) as engine:
        reply(engine, conversation(engine, TOPICS[0]), mode="auto")
    (kept,) = (disk / "costs").glob("*.json")

    def no_calibration(*args, **kwargs):
        raise AssertionError("calibrated again")

    with monkeypatch.context() as m:
        m.setattr(choice, "calibrate", no_calibration)
        with load(smollm2, slots=1, ram_mib=16, disk=disk) as engine:
            _, stats = reply(engine, conversation(engine, TOPICS[1]), mode="auto")
            assert stats.generated_tokens > 1
    kept.write_text('{"target": {"1": "NaN"}}')
    measured, real = [], choice.calibrate
    monkeypatch.setattr(choice, "calibrate", lambda *a, **kw: measured.append(1) or real(*a, **kw))
    with load(smollm2, slots=1, ram_mib=16, disk=disk) as engine:
        reply(engine, conversation(engine, TOPICS[1]), mode="auto")
    assert measured == [1]
    # kept by an older version, without some of the sizes now measured: those are measured, the rest kept
    old = json.loads(kept.read_text())
    old["target"] = {"1": 1e-6, "2": 2e-6}  # (faster than any pass: not lowered by those the reply runs)
    kept.write_text(json.dumps(old))
    with load(smollm2, slots=1, ram_mib=16, disk=disk) as engine:
        reply(engine, conversation(engine, TOPICS[1]), mode="auto")
    assert measured == [1, 1]
    target = json.loads(kept.read_text())["target"]
    assert (target["1"], target["2"]) == (1e-6, 2e-6) and len(target) > 2
    # kept with what is measured of the machine where there is such a folder, snapshots or none
    with load(smollm2, slots=1, ram_mib=0, measured=tmp_path / "measured") as engine:
        reply(engine, conversation(engine, TOPICS[0]), mode="auto")
    assert len(list((tmp_path / "measured" / "costs").glob("*.json"))) == 1

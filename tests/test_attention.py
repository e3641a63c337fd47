"""Flash attention on the CPU is chosen by measuring it here: a one-layer probe
with the model's attention shape, timed both ways, kept on disk; the choice is
whichever makes a turn (a prompt read and a reply's passes) cheaper."""

from __future__ import annotations

import json
import logging

import pytest

from edgespec.engine import attention
from edgespec.engine.attention import AttentionTimes, FlashAttnTimes, TURN_PASSES, choose_cpu_flash_attn
from edgespec.engine.events import GenerationParams
from edgespec.engine.runtime import CacheSettings, Engine, ModelSettings
from edgespec.limits import MAX_DRAFT
from edgespec.llama.model import AttentionShape, LlamaModel
from edgespec.models.attention_model import write_attention_model
from tests.blocking import returns_without_blocking

SHAPE = AttentionShape(n_head=9, n_head_kv=3, head_k=64, head_v=64)
"""SmolLM2-135M's attention."""


def times(read: float, one: float, verify: float) -> AttentionTimes:
    """One pass costs `one`; a verify pass of n tokens `verify` per 9 tokens."""
    return AttentionTimes(read, {n: one if n == 1 else verify * n / 9 for n in TURN_PASSES})


ON_READS_FASTER = FlashAttnTimes(on=times(1.0, 0.012, 0.060), off=times(1.15, 0.010, 0.030))
"""Reading 15% dearer without it, passes much cheaper: off would win the turn, but
the first token would wait longer than plain llama.cpp makes it wait."""
OFF_READS_AS_FAST = FlashAttnTimes(on=times(1.0, 0.012, 0.060), off=times(1.05, 0.010, 0.030))
"""Reading 5% dearer without it on the probe's one layer, within what the probe's
reads of one setting differ by from run to run: as fast."""
OFF_PASSES_FASTER = FlashAttnTimes(on=times(1.0, 0.012, 0.060), off=times(0.98, 0.010, 0.030))
"""Reading no dearer without it, passes much cheaper."""
OFF_ONLY_READS_FASTER = FlashAttnTimes(on=times(1.0, 0.010, 0.030), off=times(0.99, 0.012, 0.040))
"""Reading a little cheaper without it, passes dearer: on wins the turn."""


@pytest.fixture
def probe(monkeypatch):
    """attention.measure replaced by `probe.times`, counting its calls; nothing kept in the process."""
    class Probe:
        times = OFF_PASSES_FASTER
        calls = 0

        def __call__(self, shape, **kw):
            self.calls += 1
            return self.times

    fake = Probe()
    monkeypatch.setattr(attention, "measure", fake)
    monkeypatch.setattr(attention, "_measured", {})
    return fake


def test_off_only_where_it_reads_no_slower_and_makes_a_turn_cheaper():
    assert ON_READS_FASTER.off.turn() < ON_READS_FASTER.on.turn() and ON_READS_FASTER.prefer_on() is True
    assert OFF_PASSES_FASTER.prefer_on() is False
    assert OFF_READS_AS_FAST.prefer_on() is False
    assert OFF_ONLY_READS_FASTER.prefer_on() is True
    t = AttentionTimes(2.0, {n: 0.5 * n for n in TURN_PASSES})
    assert t.turn() == pytest.approx(2.0 + sum(count * 0.5 * n for n, count in TURN_PASSES.items()))


def test_the_turn_prices_the_long_verify_passes_that_lookup_drafts():
    """An edit that copies a file verifies up to limits.MAX_DRAFT guesses a pass."""
    assert max(TURN_PASSES) == MAX_DRAFT + 1 and TURN_PASSES[1] > sum(c for n, c in TURN_PASSES.items() if n > 1)


def test_the_measured_choice_is_kept_on_disk_and_used_without_measuring_again(probe, tmp_path):
    kept = tmp_path / "attention"
    probe.times = ON_READS_FASTER
    assert choose_cpu_flash_attn(SHAPE, n_ctx=4096, n_batch=512, kept=kept) is True
    assert probe.calls == 1 and len(list(kept.glob("*.json"))) == 1
    attention._measured.clear()  # a new process
    probe.times = OFF_PASSES_FASTER
    assert choose_cpu_flash_attn(SHAPE, n_ctx=4096, n_batch=512, kept=kept) is True
    assert probe.calls == 1
    # another batch size is another measurement
    assert choose_cpu_flash_attn(SHAPE, n_ctx=4096, n_batch=256, kept=kept) is False
    assert probe.calls == 2 and len(list(kept.glob("*.json"))) == 2


def test_the_choice_is_one_per_machine_whatever_threads_a_model_runs_with(synth_target, monkeypatch, tmp_path):
    """It decides the layout of the V cache, so of every KV snapshot: a conversation
    read at one thread count is restored, not read again, at another."""
    class ByThreads:
        calls = 0

        def __call__(self, shape, *, n_threads, **kw):
            self.calls += 1
            return ON_READS_FASTER if n_threads == 1 else OFF_PASSES_FASTER

    measure = ByThreads()
    monkeypatch.setattr(attention, "measure", measure)
    keys = set()
    for threads in (1, 2):
        monkeypatch.setattr(attention, "_measured", {})  # a new process each time
        with Engine.load(ModelSettings(synth_target, n_ctx=512, n_threads=threads),
                         cache=CacheSettings(measured=tmp_path / "measured", disk=tmp_path / "kv")) as engine:
            keys.add(engine._target.pool.key)
    assert measure.calls == 1 and len(keys) == 1


@pytest.mark.parametrize("damage", ["", "not json", '{"on": {}}', json.dumps({"on": {"read": 1, "passes": {"3": 1}},
                                                                               "off": {"read": 1, "passes": {}}}),
                                    "[" * 100_000, json.dumps(OFF_READS_AS_FAST.to_json()).replace("1.05", "9" * 400)],
                         ids=["empty", "not json", "another shape", "other passes", "deeply nested", "a number past a float"])
def test_a_damaged_measurement_is_measured_again_with_a_log_line(probe, tmp_path, caplog, damage):
    kept = tmp_path / "attention"
    choose_cpu_flash_attn(SHAPE, n_ctx=4096, n_batch=512, kept=kept)
    [path] = kept.glob("*.json")
    path.write_text(damage)
    attention._measured.clear()
    probe.times = ON_READS_FASTER
    with caplog.at_level(logging.INFO, logger="edgespec.attention"):
        assert choose_cpu_flash_attn(SHAPE, n_ctx=4096, n_batch=512, kept=kept) is True
    assert probe.calls == 2 and "measuring flash attention again" in caplog.text
    assert FlashAttnTimes.from_json(json.loads(path.read_text())) == ON_READS_FASTER


def test_two_processes_keeping_a_measurement_at_once_both_keep_it(probe, tmp_path, monkeypatch, caplog):
    """Each process writes its own temporary file: another's save between this one's
    write and rename does not make this one fail or leave a file behind."""
    import os
    from pathlib import Path

    kept = tmp_path / "attention"
    real_replace, others = os.replace, []

    def replace(src, dst):
        if not others:  # another process saves the same measurement now
            others.append(dst)
            with monkeypatch.context() as m:
                m.setattr(os, "getpid", lambda: 4_000_000)
                attention._save(kept, Path(dst).stem, probe.times)
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    with caplog.at_level(logging.INFO, logger="edgespec.attention"):
        choose_cpu_flash_attn(SHAPE, n_ctx=4096, n_batch=512, kept=kept)
    assert others and "could not keep" not in caplog.text
    [path] = kept.iterdir()
    assert FlashAttnTimes.from_json(json.loads(path.read_text())) == probe.times


def test_a_fifo_in_place_of_a_measurement_is_measured_again_without_waiting(probe, tmp_path):
    """Only a regular file is read: a FIFO in its place blocked the load until a writer came."""
    import os

    kept = tmp_path / "attention"
    choose_cpu_flash_attn(SHAPE, n_ctx=4096, n_batch=512, kept=kept)
    [path] = kept.glob("*.json")
    path.unlink()
    os.mkfifo(path)
    attention._measured.clear()
    probe.times = ON_READS_FASTER
    on = returns_without_blocking(path, lambda: choose_cpu_flash_attn(SHAPE, n_ctx=4096, n_batch=512, kept=kept))
    assert on is True and probe.calls == 2


def test_a_cache_folder_that_cannot_be_written_leaves_the_choice_to_llama_cpp(monkeypatch, tmp_path, caplog):
    """The probe's file goes nowhere but edgespec's own folder."""
    monkeypatch.setattr(attention, "_measured", {})
    blocked = tmp_path / "a file"
    blocked.write_text("")
    with caplog.at_level(logging.WARNING, logger="edgespec.attention"):
        assert choose_cpu_flash_attn(SHAPE, n_ctx=4096, n_batch=512, kept=blocked / "attention") is None
    assert "could not measure flash attention" in caplog.text


def test_a_probe_that_fails_leaves_the_choice_to_llama_cpp_and_says_so(monkeypatch, tmp_path, caplog):
    def broken(shape, **kw):
        raise OSError("No space left on device")

    monkeypatch.setattr(attention, "measure", broken)
    monkeypatch.setattr(attention, "_measured", {})
    with caplog.at_level(logging.WARNING, logger="edgespec.attention"):
        assert choose_cpu_flash_attn(SHAPE, n_ctx=4096, n_batch=512, kept=tmp_path) is None
    assert "could not measure flash attention (No space left on device)" in caplog.text


def test_where_the_scores_of_a_batch_would_take_too_much_memory_flash_attention_stays_on_unmeasured(probe):
    """Without it llama.cpp holds n_ctx x n_batch x n_head floats of attention scores:
    fine at a 12k context for a 1.5B model (12 heads), not at 32k."""
    qwen = AttentionShape(12, 2, 128, 128)
    assert choose_cpu_flash_attn(qwen, n_ctx=32768, n_batch=512, kept=None) is None
    assert probe.calls == 0
    assert choose_cpu_flash_attn(qwen, n_ctx=12288, n_batch=512, kept=None) is False
    assert probe.calls == 1


def test_the_probe_model_has_the_attention_shape_of_the_model_it_stands_for(smollm2, tmp_path):
    model = LlamaModel(smollm2)
    try:
        assert model.attention_shape() == SHAPE
    finally:
        model.close()
    qwen = AttentionShape(12, 2, 128, 128)
    probe_model = LlamaModel(write_attention_model(tmp_path / "probe.gguf", qwen))
    try:
        assert probe_model.attention_shape() == qwen and probe_model.n_layer() == 1
    finally:
        probe_model.close()


def test_the_probe_times_both_settings_on_this_cpu_and_leaves_no_file(tmp_path):
    measured = attention.measure(SHAPE, depth=128, n_batch=512, n_threads=1, rounds=1, scratch=tmp_path / "kept")
    assert list((tmp_path / "kept").iterdir()) == []
    for t in (measured.on, measured.off):
        assert t.read > 0 and set(t.passes) == set(TURN_PASSES) and all(s > 0 for s in t.passes.values())
    assert FlashAttnTimes.from_json(json.loads(json.dumps(measured.to_json()))) == measured


@pytest.mark.parametrize("measured, wanted, conversations", [(ON_READS_FASTER, "on", 1), (OFF_PASSES_FASTER, "off", 1)])
def test_a_model_all_on_the_cpu_runs_with_the_flash_attention_measured_cheaper_here(
        smollm2, probe, tmp_path, measured, wanted, conversations):
    """Measured once, kept in the folder for what is measured here (with or without
    disk snapshots); on the CPU, with or without it, attention goes over every cell
    of the cache, so one conversation is held (slots.default_slots). Asked
    for, or needed by exact kernels, it is as asked."""
    probe.times = measured
    with Engine.load(ModelSettings(smollm2, n_ctx=512), cache=CacheSettings(measured=tmp_path / "measured")) as engine:
        info = engine.describe()
        assert (info.target.flash_attn, info.conversations) == (wanted, conversations)
        # unfused, a prompt is read in micro-batches that keep its scores in the caches
        assert engine.target_seq.ctx.n_ubatch == (attention.UNFUSED_UBATCH if wanted == "off" else 512)
        prompt = engine.tokenize("The history of the bicycle began", add_bos=True)
        out = [t for chunk in engine.generate(prompt, GenerationParams(mode="plain", max_tokens=8)) for t in chunk.tokens]
        assert len(out) == 8
    assert probe.calls == 1 and list((tmp_path / "measured" / "attention").glob("*.json"))
    for settings, asked in ((ModelSettings(smollm2, n_ctx=512, flash_attn=True), "on"),
                            (ModelSettings(smollm2, n_ctx=512, flash_attn=False), "off"),
                            (ModelSettings(smollm2, n_ctx=512, exact=True), "on")):
        with Engine.load(settings) as engine:
            assert engine.describe().target.flash_attn == asked
    assert probe.calls == 1


KILLED_PROBE = """
import pathlib, sys
from edgespec.engine import attention
from edgespec.llama.model import AttentionShape
attention.measure(AttentionShape(9, 3, 64, 64), depth=4096, n_batch=512, n_threads=1, rounds=100,
                  scratch=pathlib.Path(sys.argv[1]))
"""


def test_a_probe_killed_while_it_runs_leaves_nothing_past_the_next_probe(tmp_path):
    """SIGKILL runs no cleanup: the next probe removes the scratch of a process that
    is gone, and any older than a probe takes, and leaves a running one's alone."""
    import os
    import signal
    import subprocess
    import sys
    import time

    scratch = tmp_path / "kept"
    killed = subprocess.Popen([sys.executable, "-c", KILLED_PROBE, str(scratch)])
    try:
        deadline = time.monotonic() + 120
        while not list(scratch.glob("probe-*/probe.gguf")):  # the probe's file is being written or read
            assert killed.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
    finally:
        killed.send_signal(signal.SIGKILL)
        killed.wait()
    assert list(scratch.iterdir())
    running = scratch / f"probe-{os.getppid()}-now"  # a live process's, fresh
    old = scratch / f"probe-{os.getppid()}-old"  # a live process's, older than any probe
    for folder in (running, old):
        folder.mkdir()
        (folder / "probe.gguf").write_bytes(b"GGUF")
    os.utime(old, (time.time() - 2 * 86400,) * 2)
    attention.measure(SHAPE, depth=128, n_batch=512, n_threads=1, rounds=1, scratch=scratch)
    assert sorted(scratch.iterdir()) == [running]


@pytest.mark.parametrize("on_cpu, flash_attn, slots", [(True, True, 1), (True, False, 1), (False, None, 4),
                                                       (False, True, 4), (False, False, 1)])
def test_the_conversations_held_at_once_are_those_that_cost_no_decoding_speed(on_cpu, flash_attn, slots):
    """On a CPU even flash attention's kernel goes over every cell of the unified cache, other
    conversations' included: three others of 1,500 tokens beside one of 1,500 made each token
    16% slower (docs/design.md), so they wait in RAM snapshots there."""
    from edgespec.engine.slots import default_slots

    assert default_slots(flash_attn, on_cpu=on_cpu) == slots

"""Stopping a reply from another thread while the engine reads a long prompt
(Esc in the app, a client gone from the server): the read stops within a
fraction of a batch, and the caches stay usable (SmolLM2-135M)."""

from __future__ import annotations

import threading
import time

import pytest

from edgespec.engine.events import GenerationParams
from edgespec.engine.runtime import Engine, ModelSettings

pytestmark = pytest.mark.slow

N_BATCH = 128


def long_prompt(engine: Engine) -> list[int]:
    """Nearly four batches of text."""
    text = " ".join(f"Note {i}: the river bends north past the old mill, then east to the sea." for i in range(30))
    tokens = engine.tokenize(text)[: 4 * N_BATCH - 16]
    assert len(tokens) > 3 * N_BATCH
    return tokens


def reply(engine: Engine, prompt: list[int]) -> list[int]:
    out = []
    for chunk in engine.generate(prompt, GenerationParams(mode="plain", max_tokens=8)):
        out += chunk.tokens
    return out


def load(model) -> Engine:
    return Engine.load(ModelSettings(model, n_ctx=512, n_batch=N_BATCH, flash_attn=True))  # no probe at load


def test_interrupting_a_long_prompt_read_stops_within_a_fraction_of_a_batch(smollm2):
    with load(smollm2) as engine:
        prompt = long_prompt(engine)
        first_batch, chunks, ended = threading.Event(), [], threading.Event()
        times: dict[str, float] = {}

        def consume() -> None:
            times["start"] = time.perf_counter()
            for chunk in engine.generate(prompt, GenerationParams(mode="plain", max_tokens=8)):
                chunks.append(chunk)
                if chunk.stats.prompt_evaluated and "first" not in times:
                    times["first"] = time.perf_counter()
                    first_batch.set()  # the next batch is read as soon as this returns
            times["end"] = time.perf_counter()
            ended.set()

        consumer = threading.Thread(target=consume)
        consumer.start()
        assert first_batch.wait(120)
        times["interrupt"] = time.perf_counter()
        engine.interrupt()
        assert ended.wait(120), "the stream did not end"
        consumer.join()

        stats = chunks[-1].stats
        assert stats.stop_reason == "cancelled" and stats.generated_tokens == 0
        assert not any(c.tokens for c in chunks)
        batch_s = times["first"] - times["start"]
        # the batch in progress stopped: well before a batch's time, let alone the rest of the prompt
        assert times["end"] - times["interrupt"] < batch_s / 4, (times, batch_s)
        held = len(engine.target_seq.tokens)
        assert held % N_BATCH == 0 and N_BATCH <= held < len(prompt)  # whole batches read before the stop
        assert engine.target_seq.tokens == prompt[:held]

        # the engine goes on: the next reply is a fresh engine's, and an interrupt between replies is a no-op
        engine.interrupt()
        again = reply(engine, prompt)
    with load(smollm2) as fresh:
        assert again == reply(fresh, prompt)


def test_ctrl_c_while_a_model_loads_ends_the_load_with_keyboard_interrupt(synth_target, monkeypatch):
    """Ctrl+C that comes while llama.cpp calls back into Python during a load (its log,
    its progress) was raised inside the callback, where ctypes prints and drops it: the
    load went on and the command answered, exit status 0. Now it is noted, the load
    is told to stop, and KeyboardInterrupt is raised once llama.cpp has returned."""
    import os
    import signal

    from edgespec.llama import backend
    from edgespec.llama.model import LlamaModel

    told = []
    ask = backend.loading_progress

    def interrupted_at_once(fraction: float) -> bool:
        if not told:
            os.kill(os.getpid(), signal.SIGINT)  # as a terminal's Ctrl+C, in the callback
        told.append(fraction)
        return ask(fraction)

    monkeypatch.setattr(backend, "loading_progress", interrupted_at_once)
    with pytest.raises(KeyboardInterrupt):
        LlamaModel(synth_target)
    assert told == [told[0]]  # the load stopped at its first report
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    LlamaModel(synth_target).close()  # and the next load is not stopped


def test_loads_told_to_stop_end_and_later_loads_do_not(synth_target, monkeypatch):
    """An app quitting while a model loads (stop_loading) ends that load at its next
    report instead of waiting for it (the process stayed until the load was done); a
    load begun afterwards runs to its end."""
    from edgespec.engine.runtime import stop_loading
    from edgespec.errors import ModelLoadError
    from edgespec.llama import backend
    from edgespec.llama.model import LlamaModel

    told = []
    ask = backend.loading_progress

    def quit_at_once(fraction: float) -> bool:
        if not told:
            stop_loading()
        told.append(fraction)
        return ask(fraction)

    monkeypatch.setattr(backend, "loading_progress", quit_at_once)
    with pytest.raises(ModelLoadError, match="stopped"):
        LlamaModel(synth_target)
    assert len(told) == 1
    monkeypatch.setattr(backend, "loading_progress", ask)
    LlamaModel(synth_target).close()

"""How attention runs where every layer is on the CPU: flash attention or not,
measured on this machine, and so how many conversations a context can hold at
no cost."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import llama_cpp

from edgespec.config import read_kept
from edgespec.engine.cache import KVSequence
from edgespec.engine.snapshots import cache_key
from edgespec.llama import system_info
from edgespec.llama.context import LlamaContext
from edgespec.llama.model import AttentionShape, LlamaModel
from edgespec.machine import cpu_name
from edgespec.models.attention_model import N_VOCAB, write_attention_model

log = logging.getLogger("edgespec.attention")

CPU_SCORES_MAX_BYTES = 512 << 20
"""Flash attention for a model whose layers all run on the CPU may be off only
while the attention scores of one batch over the whole context (what the unfused
path holds, n_ctx x n_batch x n_head floats) take at most this much memory;
beyond, it is on (llama.cpp's choice), which holds none of them."""

PROBE_DEPTH = 1536
"""Tokens of context the probe reads, and runs its passes after: a conversation
that holds a source file."""

TURN_PASSES = {1: 128, 17: 8, 65: 4}
"""Passes by size that a turn decodes after reading its prompt: a reply of some
500 tokens, mostly decoded one token a pass (auto mode on a CPU, where drafting
rarely pays), partly verified in long lookup drafts (an edit that copies a
file). ggml's CPU kernel for flash attention reads the whole KV cache once per
token of a batch, where the unfused path multiplies the batch against the cache
in one matrix product, so verify passes favour it off (a 65-token pass at 3,000
tokens of context: 1.2 s off, 1.7 s on, the bundled 1.5B on a 2-core Zen 4);
reading a prompt favours it on some CPUs and off on others
(scripts/bench_flash_attn.py compares both on the real model)."""

UNFUSED_UBATCH = 256
"""Tokens the unfused path (flash attention off) computes at once while reading a
prompt. Its attention scores (ubatch x context x heads floats) at llama.cpp's
512 outgrow the CPU's caches deep in a conversation; at 256 the bundled 1.5B
read 1,536 and 3,000 tokens as fast as with flash attention at 512 (17.4 s
against 17.6, 38.6 against 38.7; 2-core Zen 4, 4 interleaved rounds), and 7 %
faster than unfused at 512."""


def ubatch(flash_attn: bool | None) -> int | None:
    """The micro-batch a context runs with: UNFUSED_UBATCH where flash attention is
    off, else None (the batch size: llama.cpp's default)."""
    return UNFUSED_UBATCH if flash_attn is False else None


READ_NOISE = 0.1
"""How much slower off may read the probe's prompt and still count as fast: the
probe's reads of one layer, one setting, differ by this much from run to run (89
to 116 ms, the bundled 1.5B's shape, 2-core Zen 4), and one layer's attention is
a small part of a real read (some 15 %), where the two settings read alike (see
UNFUSED_UBATCH)."""

PROBE_ROUNDS = 3
"""Interleaved rounds of the probe, on and off in turn; medians."""

PROBE_THREADS = os.cpu_count() or 1
"""Threads the probe runs on, whatever a model runs with: the choice is one per
machine, not per thread count, because it decides what a KV snapshot holds
(flash attention lays the V cache out otherwise, and llama.cpp refuses a
snapshot of the other layout), so a conversation read with --threads 1 is
restored, not read again, at 2 threads."""


@dataclass(frozen=True)
class AttentionTimes:
    """Seconds on the probe model (one layer of a model's attention) with one setting."""

    read: float
    """Reading PROBE_DEPTH tokens into an empty cache."""
    passes: dict[int, float]
    """One pass of n tokens at that depth, by n."""

    def turn(self) -> float:
        """A turn: the read and TURN_PASSES."""
        return self.read + sum(count * self.passes[n] for n, count in TURN_PASSES.items())


@dataclass(frozen=True)
class FlashAttnTimes:
    """The probe's times with flash attention on and off."""

    on: AttentionTimes
    off: AttentionTimes

    def prefer_on(self) -> bool:
        """On (llama.cpp's own choice) unless off reads a prompt as fast (within
        READ_NOISE) and makes a turn cheaper: the first token must not wait longer
        than plain llama.cpp makes it wait, even where faster verify passes would
        make up for it later in the reply."""
        return not (self.off.read <= self.on.read * (1 + READ_NOISE) and self.off.turn() < self.on.turn())

    def to_json(self) -> dict:
        return {name: {"read": t.read, "passes": {str(n): s for n, s in t.passes.items()}}
                for name, t in (("on", self.on), ("off", self.off))}

    @classmethod
    def from_json(cls, data: dict) -> FlashAttnTimes:
        """Raises KeyError, TypeError or ValueError on anything but to_json's shape."""
        def times(d: dict) -> AttentionTimes:
            passes = {int(n): float(s) for n, s in d["passes"].items()}
            if set(passes) != set(TURN_PASSES):
                raise ValueError("measured for other passes")
            return AttentionTimes(float(d["read"]), passes)
        return cls(times(data["on"]), times(data["off"]))


def _scores_fit(n_ctx: int, n_batch: int, n_head: int) -> bool:
    """Whether the unfused path's scores fit CPU_SCORES_MAX_BYTES."""
    return n_ctx * n_batch * n_head * 4 <= CPU_SCORES_MAX_BYTES


def choose_cpu_flash_attn(shape: AttentionShape, *, n_ctx: int, n_batch: int,
                          kept: Path | None = None) -> bool | None:
    """Flash attention for a model all on the CPU, as the probe measured it here
    on PROBE_THREADS (FlashAttnTimes.prefer_on; None: on, llama.cpp's choice,
    where the scores would not fit). The probe's times are kept in `kept` (a
    folder) and for the process, per shape, context, batch, CPU and llama.cpp;
    a probe that fails leaves the choice to llama.cpp."""
    if not _scores_fit(n_ctx, n_batch, shape.n_head):
        return None
    depth = max(1, min(PROBE_DEPTH, n_ctx - max(TURN_PASSES)))  # as deep as a conversation gets
    key = cache_key(shape=shape, depth=depth, n_batch=n_batch, threads=PROBE_THREADS, cpu=cpu_name(),
                    system=system_info()["system_info"], llama_cpp=llama_cpp.__version__, passes=TURN_PASSES,
                    unfused_ubatch=UNFUSED_UBATCH)
    times = _measured.get(key) or _load(kept, key)
    if times is None:
        try:
            times = measure(shape, depth=depth, n_batch=n_batch, n_threads=PROBE_THREADS, scratch=kept)
        except Exception as e:  # a choice of kernels must never stop a load
            log.warning("could not measure flash attention (%s): llama.cpp chooses", e)
            return None
        _save(kept, key, times)
    _measured[key] = times
    chosen = times.prefer_on()
    log.info("flash attention %s: on this CPU one layer reads %d tokens in %.0f ms with it, %.0f without, "
             "and a turn costs %.0f ms with it, %.0f without", "on" if chosen else "off", depth,
             times.on.read * 1e3, times.off.read * 1e3, times.on.turn() * 1e3, times.off.turn() * 1e3)
    return True if chosen else False


_measured: dict[str, FlashAttnTimes] = {}


def measure(shape: AttentionShape, *, depth: int, n_batch: int, n_threads: int,
            rounds: int = PROBE_ROUNDS, scratch: Path | None = None) -> FlashAttnTimes:
    """Time the probe model of `shape` with flash attention on and off: a read of
    `depth` tokens and TURN_PASSES' sizes at that depth, interleaved, medians.
    The probe's file lives in `scratch` (edgespec's own folder) while it runs,
    or in the system's temporary folder where there is none; what killed probes
    left there goes first."""
    if scratch is not None:
        scratch.mkdir(parents=True, exist_ok=True)
        _remove_left_over(scratch)
    with tempfile.TemporaryDirectory(prefix=f"probe-{os.getpid()}-", dir=scratch) as folder:
        model = LlamaModel(write_attention_model(Path(folder) / "probe.gguf", shape))
        seqs: dict[bool, KVSequence] = {}
        try:
            for on in (True, False):
                seqs[on] = KVSequence(LlamaContext(model, n_ctx=depth + max(TURN_PASSES), n_batch=n_batch,
                                                   n_threads=n_threads, flash_attn=on, n_ubatch=ubatch(on)))
            tokens = [3 + i % (N_VOCAB - 3) for i in range(depth + max(TURN_PASSES))]
            reads: dict[bool, list[float]] = {True: [], False: []}
            passes: dict[bool, dict[int, list[float]]] = {True: {}, False: {}}
            for r in range(rounds):
                for on in ((True, False) if r % 2 == 0 else (False, True)):
                    seq = seqs[on]
                    seq.truncate(0)
                    reads[on].append(_timed(lambda: seq.sync(tokens[:depth])))
                    for n in TURN_PASSES:
                        passes[on].setdefault(n, []).append(
                            _timed(lambda: seq.extend(tokens[depth:depth + n], all_logits=True)))
                        seq.truncate(depth)
            return FlashAttnTimes(*(AttentionTimes(statistics.median(reads[on]),
                                                   {n: statistics.median(ts) for n, ts in passes[on].items()})
                                    for on in (True, False)))
        finally:
            for seq in seqs.values():
                seq.close()
                seq.ctx.close()
            model.close()


PROBE_LEFT_OVER_S = 3600
"""A probe's folder older than this was left by a killed probe, whichever process
made it: a probe takes seconds, minutes on a slow machine."""


def _remove_left_over(scratch: Path) -> None:
    """Remove the folders of probes that were killed (SIGKILL runs no cleanup):
    those of a process that is gone, and any older than PROBE_LEFT_OVER_S."""
    for folder in scratch.glob("probe-*"):
        parts = folder.name.split("-")  # probe-<pid>-<random>; an older edgespec's has no pid
        pid = int(parts[1]) if len(parts) == 3 and parts[1].isdigit() else None
        if (pid is not None and not _running(pid)) or _age(folder) > PROBE_LEFT_OVER_S:
            shutil.rmtree(folder, ignore_errors=True)


def _age(path: Path) -> float:
    """Seconds since `path` was modified (0 if it is gone)."""
    try:
        return time.time() - path.stat().st_mtime
    except OSError:
        return 0.0


def _running(pid: int) -> bool:
    """Whether process `pid` is running (on Windows, where a signal would end it: assumed)."""
    if os.name == "nt" or pid <= 0:
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's
        return True
    return True


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _load(kept: Path | None, key: str) -> FlashAttnTimes | None:
    if kept is None:
        return None
    path = kept / f"{key}.json"
    try:
        return FlashAttnTimes.from_json(json.loads(read_kept(path, limit=1 << 20)))  # a few hundred bytes written
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError, AttributeError, OverflowError, RecursionError) as e:
        # not a measurement (OverflowError: a number past a float; RecursionError: json's nesting limit)
        log.info("measuring flash attention again: %s is unreadable (%s)", path, e)
        return None


def _save(kept: Path | None, key: str, times: FlashAttnTimes) -> None:
    """Atomically; a full disk or a read-only folder only means measuring next time."""
    if kept is None:
        return
    path = kept / f"{key}.json"
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")  # one per process: two may measure at once
    try:
        kept.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps(times.to_json()))
        os.replace(tmp, path)
    except OSError as e:
        log.info("could not keep the flash attention measurement in %s: %s", kept, e)
        with contextlib.suppress(OSError):  # (no folder to clean: a file in its place)
            tmp.unlink(missing_ok=True)

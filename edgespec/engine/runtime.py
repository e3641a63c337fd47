"""Engine: a loaded target (and optional draft model) ready to generate.

Owns the native objects through edgespec.llama and frees them in order
(contexts before models). Knows no screen, no file format of ours and no
network: paths in, chunks out.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Iterator, Sequence

import llama_cpp

from edgespec.engine import decoder
from edgespec.engine.attention import choose_cpu_flash_attn, ubatch
from edgespec.engine.auto import AutoPolicy
from edgespec.engine.cache import KVSequence
from edgespec.engine.choice import Policies, decoded_mode
from edgespec.engine.costs import HEALED_TO
from edgespec.engine.drafters import DraftModel, engine_drafters
from edgespec.engine.regions import Region, Regions
from edgespec.engine.events import Chunk, GenerationParams
from edgespec.engine.info import EngineInfo, LayerRun, ModelInfo
from edgespec.engine.policy import Policy
from edgespec.engine.pool import Pool, forget_everywhere, vocab_id
from edgespec.engine.slots import SequencePool, default_slots
from edgespec.engine.snapshots import SnapshotCache, cache_key, file_identity
from edgespec.errors import InvalidTokenError, ModelLoadError
from edgespec.llama import system_info
from edgespec.llama.backend import stop_loads
from edgespec.llama.context import DecodeAborted, LlamaContext
from edgespec.llama.model import LlamaModel
from edgespec.models.compat import VocabInfo, ensure_compatible
from edgespec.net import Split

log = logging.getLogger("edgespec.cache")

POOL_SAVE_S = 300.0
"""The lookup pool is written at close, and after a remember this long after its last save
(a server that runs for days, a crash): never while a reply decodes."""


@dataclass
class ModelSettings:
    """Where a model is and how to run it. Target and draft each have their own."""

    path: str | Path
    n_gpu_layers: int = 0
    """Layers to offload to the GPU; -1 for all."""
    n_ctx: int = field(kw_only=True)
    """Context size in tokens; no default here: the face's LoadSettings gives it, or
    edgespec.load chooses it for the models and this machine (placement.fit_context)."""
    n_threads: int | None = None
    """CPU threads; None for all cores."""
    n_batch: int = 512
    exact: bool = False
    """Verify passes that give, bit for bit, the logits of single-token passes,
    so that greedy speculation is token for token plain greedy decoding: a Q8_0
    KV cache (llama.cpp then does not split single-token attention across
    threads) and verify passes capped at the largest batch measured to be exact
    on this machine, once (llama.cpp's repacked CPU weights take another path
    from a few columns on, so only short verify batches stay exact; plain weight
    layouts would keep longer ones exact but slow every pass, which
    scripts/exact_kernels.py measures).
    Off (the default), llama.cpp runs as plain llama.cpp does: every token is
    still the target's own choice from its own logits, but a batch rounds
    differently from single tokens, so a near-tie can flip. Only a target
    needs it: a draft model only guesses."""
    rpc: Split | None = None
    """RPC workers (and this machine's GPUs) for the n_gpu_layers offloaded layers;
    the rest stay on this machine's CPU. Only a target: the draft stays local."""
    flash_attn: bool | None = None
    """Flash attention on or off; None: edgespec's choice (where every layer runs
    on this machine's CPU, as measured here: engine/attention.py; else
    llama.cpp's). Exact kernels need it on (their Q8_0 cache) and override an off."""


def vocab_info(model: LlamaModel) -> VocabInfo:
    return VocabInfo(
        vocab_type=model.vocab_type(),
        tokens=[model.get_text(i) for i in range(model.n_vocab)],
        bos=model.bos(),
        eos=model.eos(),
        add_bos=model.add_bos(),
    )


@dataclass
class CacheSettings:
    """How many conversations the KV caches hold at once, and what is kept of
    those they let go (snapshots, engine/snapshots.py). One for the engine."""

    slots: int | None = None
    """Sequences in each model's context: conversations held at once, switched
    between with no reading at all. None: slots.default_slots."""
    ram_mib: int = 2048
    """Host memory for snapshots of conversations evicted from the KV caches; 0: none."""
    disk: Path | None = None
    """Folder for snapshots kept between runs (the app and `chat` use one); None: none."""
    disk_mib: int = 4096
    measured: Path | None = None
    """Folder for what is measured of this machine once and kept between runs
    (flash attention on the CPU, engine/attention.py), whether or not snapshots
    are; None: measured again by each process."""
    pool: Path | None = None
    """Folder of the lookup pool, the earlier text kept between runs (engine/pool.py);
    None: no pool, and nothing to forget."""
    pool_mib: int = 64
    """What the pool holds at most (the file keeps what the last process to save it
    kept); 0: off (nothing remembered, but forgetting still reaches the files)."""

    def snapshot_cache(self) -> SnapshotCache:
        return SnapshotCache(ram_bytes=self.ram_mib << 20, disk=self.disk, disk_bytes=self.disk_mib << 20)


def flash_attention(settings: ModelSettings, model: LlamaModel, measured: Path | None) -> bool | None:
    """A step of loading: flash attention for `model`. On for exact kernels; else
    as asked; else, where every layer runs on this machine's CPU, as the probe
    measured it here (choose_cpu_flash_attn, once per machine, its times kept in
    `measured`/attention), and elsewhere llama.cpp's choice (None)."""
    if settings.exact:
        return True
    if settings.flash_attn is not None:
        return settings.flash_attn
    if not runs_on_cpu(settings, model):
        return None
    return choose_cpu_flash_attn(model.attention_shape(), n_ctx=settings.n_ctx, n_batch=settings.n_batch,
                                 kept=measured / "attention" if measured else None)


def runs_on_cpu(settings: ModelSettings, model: LlamaModel) -> bool:
    """Whether every layer of `model` runs on this machine's CPU."""
    devices = set(model.layer_devices.values())
    if not devices:  # llama.cpp did not say where the layers went: by what was asked
        return settings.n_gpu_layers == 0 and settings.rpc is None
    return devices == {"CPU"}


def open_context(settings: ModelSettings, model: LlamaModel, flash_attn: bool | None, slots: int) -> LlamaContext:
    """A step of loading: the model's context, holding `slots` conversations."""
    common = dict(n_ctx=settings.n_ctx, n_batch=settings.n_batch, n_threads=settings.n_threads, n_seq_max=slots)
    if not settings.exact:
        return LlamaContext(model, flash_attn=flash_attn, n_ubatch=ubatch(flash_attn), **common)
    # A Q8_0 cache keeps llama.cpp's single-token attention from splitting
    # the cache across threads (summing in another order than a batch does).
    # Heads whose size is not a multiple of 32 cannot have one: fall back to
    # F16, and the exactness probe caps what that costs.
    try:
        return LlamaContext(model, kv_type="q8_0", flash_attn=True, **common)
    except ModelLoadError:
        return LlamaContext(model, kv_type="f16", flash_attn=True, **common)


class _Loaded:
    """One model with its context and the KV sequences in it (`load`: in steps)."""

    def __init__(self, settings: ModelSettings, model: LlamaModel, ctx: LlamaContext, *,
                 cache: SnapshotCache | None = None):
        self.settings, self.model, self.ctx = settings, model, ctx
        # the key reads the model file: only where there are snapshots to tell apart
        self.pool = SequencePool(ctx, key=self._cache_key() if cache else "", cache=cache)

    @classmethod
    def load(cls, settings: ModelSettings, *, slots: int | None = 1, cache: SnapshotCache | None = None,
             measured: Path | None = None) -> "_Loaded":
        """The model file, its flash attention, its context and sequences, one step
        after another. `slots` None: as many as cost nothing (slots.default_slots);
        `measured`: CacheSettings.measured."""
        model = LlamaModel(settings.path, n_gpu_layers=settings.n_gpu_layers, split=settings.rpc)
        ctx = None
        try:
            flash_attn = flash_attention(settings, model, measured)
            ctx = open_context(settings, model, flash_attn,
                               slots or default_slots(flash_attn, on_cpu=runs_on_cpu(settings, model)))
            return cls(settings, model, ctx, cache=cache)
        except BaseException:
            if ctx is not None:
                ctx.close()
            model.close()
            raise

    @property
    def flash_attn(self) -> bool | None:
        """The context's: as asked, on for exact kernels, or edgespec's choice."""
        return self.ctx.flash_attn

    @property
    def seq(self) -> KVSequence:
        """The sequence in use."""
        return self.pool.current

    @property
    def exact(self) -> bool:
        return self.settings.exact

    def _cache_key(self) -> str:
        """What a KV snapshot of this model must have been made with to be used here:
        the same file and llama.cpp, the cache's type (Q8_0 for exact kernels) and
        layout (flash attention on or off: llama.cpp refuses a snapshot of the other),
        and where the layers run (which decides llama.cpp's own choice). Threads,
        batch size and context size leave a snapshot's bytes usable: it is passed
        over only where it holds more tokens than the context (SnapshotCache.find)."""
        s, c = self.settings, self.ctx
        return cache_key(model=file_identity(s.path), kv=c.kv_type, flash_attn=c.flash_attn,
                         n_gpu_layers=s.n_gpu_layers, rpc=str(s.rpc) if s.rpc else None,
                         llama_cpp=llama_cpp.__version__)

    def close(self) -> None:
        self.pool.close()
        self.ctx.close()
        self.model.close()


def stop_loading() -> None:
    """From any thread: a model load running now (Engine.load) ends with ModelLoadError at
    llama.cpp's next progress report, instead of running to its end (an app quitting)."""
    stop_loads()


def _check_tokens(tokens: Sequence[int], n_vocab: int) -> None:
    """Raise InvalidTokenError unless every token id lies in 0..n_vocab-1: llama.cpp
    fails a whole decode on one that does not, and the lookup pool would keep it."""
    if tokens and not (min(tokens) >= 0 and max(tokens) < n_vocab):
        bad = next(t for t in tokens if not 0 <= t < n_vocab)
        raise InvalidTokenError(f"token id {bad} is not in the model's vocabulary (0 to {n_vocab - 1})")


def _open_pool(cache: CacheSettings, model: LlamaModel) -> Pool | None:
    """The lookup pool for the model's tokenizer, sorted for matching here (on the
    loading thread, so that no reply waits for it); None where it is off."""
    if cache.pool is None or cache.pool_mib <= 0:
        return None
    pool = Pool.open(cache.pool, vocab_id(vocab_info(model)), budget_bytes=cache.pool_mib << 20,
                     vocab_size=model.n_vocab)
    pool.index.prepare()
    return pool


def _placement(model: LlamaModel) -> tuple[LayerRun, ...]:
    """How many layers (the output layer counts as one) each device holds, in
    layer order: (LayerRun("CPU", None, 12), LayerRun("RPC0", "10.0.0.2:50052", 19))."""
    workers = {d.name: str(d.endpoint) if d.endpoint else None for d in model.devices}
    rows: list[LayerRun] = []
    for _, name in sorted(model.layer_devices.items()):
        if rows and rows[-1].device == name:
            rows[-1] = replace(rows[-1], layers=rows[-1].layers + 1)
        else:
            rows.append(LayerRun(name, workers.get(name), 1))
    return tuple(rows)


class Engine:
    """Generates with the target, speculating with a draft model or prompt lookup."""

    def __init__(self, target: _Loaded, draft: _Loaded | None, cache: SnapshotCache | None = None, *,
                 pool: Pool | None = None, pool_folder: Path | None = None, measured: Path | None = None):
        """`pool`: the lookup pool for the target's tokenizer, if it is on; `pool_folder`:
        where every tokenizer's pool file is (CacheSettings.pool), for `forget`;
        `measured`: CacheSettings.measured, where auto's calibration is kept."""
        self._measured = measured
        self._target = target
        self._draft = draft
        self._cache = cache
        self._pool = pool
        self._pool_folder = pool_folder
        self._pool_saved = time.monotonic()
        self._to_forget: set[str] = set()
        """Documents forgotten (from any thread) and not yet removed from `_pool`, which
        only the thread that generates touches."""
        self._forget_lock = threading.Lock()
        self.drafters = engine_drafters(draft.seq if draft else None, n_vocab=target.model.n_vocab,
                                        is_eog=draft.model.is_eog if draft else target.model.is_eog,
                                        pool=pool.index if pool else None)
        self.policies = Policies(target, draft, exact=target.exact, drafters=self.drafters,
                                 costs_path=self._costs_path)
        self._streams = 0
        """Streams of generate() running (their decodes are what interrupt() stops)."""
        self._reading: str | None = None
        """The part of a read() that runs: "target", "drafters" (interrupt_drafters_reading()
        stops that one), or None."""
        self._drafters_stopped = False
        """Whether the read() running now is to read no more with the drafters."""
        self._stream_lock = threading.Lock()

    @classmethod
    def load(cls, target: ModelSettings, draft: ModelSettings | None = None, *,
             cache: CacheSettings | None = None) -> "Engine":
        """Load the models; raises ModelFileError, ModelLoadError or IncompatibleDraftError.
        `cache`: conversations held at once and snapshots (default: one, none)."""
        snapshots = cache.snapshot_cache() if cache else None
        measured = cache.measured if cache else None
        t = _Loaded.load(target, slots=cache.slots if cache else 1, cache=snapshots, measured=measured)
        d = None
        try:
            if draft is not None:  # the draft's sequences pair with the target's, one to one
                d = _Loaded.load(draft, slots=t.ctx.n_seq_max, cache=snapshots, measured=measured)
                ensure_compatible(vocab_info(t.model), vocab_info(d.model),
                                  target_name=Path(target.path).name, draft_name=Path(draft.path).name)
            pool = _open_pool(cache, t.model) if cache else None
        except BaseException:
            if d is not None:
                d.close()
            t.close()
            raise
        return cls(t, d, snapshots, pool=pool, pool_folder=cache.pool if cache else None,
                   measured=cache.measured if cache else None)

    # -- the model, for chat formatting ----------------------------------
    @property
    def n_ctx(self) -> int:
        return self._target.seq.n_ctx

    @property
    def has_draft(self) -> bool:
        return self._draft is not None

    @property
    def draft_model(self) -> DraftModel | None:
        """The drafter that drafts with the draft model, if there is one."""
        return next((d for d in self.drafters if isinstance(d, DraftModel)), None)

    @property
    def target_model(self) -> LlamaModel:
        """The target's llama.cpp model (for tools and tests: its vocabulary, its RPC guard)."""
        return self._target.model

    @property
    def target_seq(self) -> KVSequence:
        """The target's KV cache and the tokens it holds (for tools that measure it)."""
        return self._target.seq

    @property
    def draft_seq(self) -> KVSequence | None:
        """The draft model's, if there is one."""
        return self._draft.seq if self._draft else None

    @property
    def chat_template(self) -> str | None:
        return self._target.model.chat_template()

    @property
    def bos(self) -> int | None:
        return self._target.model.bos()

    @property
    def eos(self) -> int | None:
        return self._target.model.eos()

    @property
    def fim_tokens(self) -> tuple[int, int, int] | None:
        model = self._target.model
        tokens = (model.fim_pre(), model.fim_suf(), model.fim_mid())
        return None if None in tokens else tokens

    def is_eog(self, token: int) -> bool:
        """Whether the target ends a reply at this token."""
        return self._target.model.is_eog(token)

    def token_text(self, token: int) -> str:
        return self._target.model.token_to_piece(token, special=True).decode("utf-8", errors="replace")

    def tokenize(self, text: str, *, add_bos: bool = False, special: bool = True) -> list[int]:
        tokens = self._target.model.tokenize(text, add_special=False, parse_special=special)
        if add_bos and self.bos is not None and self._target.model.add_bos():
            tokens.insert(0, self.bos)
        return tokens

    def detokenize(self, tokens: Sequence[int]) -> str:
        piece = self._target.model.token_to_piece
        return b"".join(piece(t, special=False) for t in tokens).decode("utf-8", errors="replace")

    # -- generation -------------------------------------------------------
    def policy(self, params: GenerationParams) -> Policy:
        """The policy for params.mode: which drafter (if any) and how many tokens."""
        return self.policies.choose(params)

    def max_verify_batch(self) -> int:
        """The most tokens one verify pass may hold (see Policies.max_verify_batch)."""
        return self.policies.max_verify_batch()

    def auto(self, params: GenerationParams) -> AutoPolicy:
        """The engine's AutoPolicy, made (and so calibrated) now if it is not yet:
        for tools that measure or set its costs before a reply."""
        return self.policies.auto(params)

    def _costs_path(self, k_max: int) -> Path | None:
        """Where the calibration for these models, settings, threads and k is kept
        between runs, if anywhere: with what else is measured of this machine once,
        else beside the KV snapshots."""
        folder = self._measured or (self._cache.disk if self._cache is not None else None)
        if folder is None:
            return None
        key = cache_key(target=self._target.pool.key, draft=self._draft.pool.key if self._draft else None,
                        threads=self._target.settings.n_threads or os.cpu_count(), k_max=k_max,
                        n_batch=self._target.ctx.n_batch, exact=self._target.exact,
                        huge_pages=[bool(m.model.huge_pages) for m in (self._target, self._draft) if m],
                        healed=HEALED_TO)
        return folder / "costs" / f"{key}.json"

    def generate(self, prompt_tokens: Sequence[int], params: GenerationParams, *,
                 regions: Sequence[Region] = ()) -> Iterator[Chunk]:
        """Stream a completion in the sequence that holds most of the prompt (the
        same conversation), reusing what it holds, or restoring a snapshot that
        holds more; both models use the same sequence number. `regions`: the
        prompt's labelled spans, which accepted lookup tokens are credited to."""
        model = self._target.model
        _check_tokens(prompt_tokens, model.n_vocab)
        self._forget_pending()
        params = replace(params, mode=decoded_mode(params))
        policy = self.policy(params)
        spans = Regions(len(prompt_tokens), regions)
        for drafter in self.drafters:
            drafter.start(spans)
        slot = self._target.pool.choose(prompt_tokens)
        if self._draft:
            self.draft_model.seq = self._draft.pool.use(slot)
        return self._interruptible(decoder.generate(
            self._target.seq, prompt_tokens, params, policy,
            is_eog=model.is_eog,
            piece=lambda t: model.token_to_piece(t, special=False),
            last_alone=self._target.exact,  # a prompt read afresh or again gives the same logits
        ))

    def read(self, prompt_tokens: Sequence[int], params: GenerationParams) -> Iterator[Chunk]:
        """Read `prompt_tokens` into the caches and reply nothing: the start of a prompt
        not sent yet (a chat's conversation, attached files and the words written so
        far; the server's last reply), so that the reply to a prompt that starts with
        them reads only the rest, in the target and in the draft model alike, where
        params' policy drafts with it (Policy.read_ahead). Streams as generate() does
        while the target reads; interrupt() stops the reading, whichever model reads,
        keeping what was read."""
        _check_tokens(prompt_tokens, self._target.model.n_vocab)
        return self._interruptible(self._read(prompt_tokens, params))

    def _read(self, prompt_tokens: Sequence[int], params: GenerationParams) -> Iterator[Chunk]:
        def held() -> bool:
            return self._target.seq.tokens[: len(prompt_tokens)] == list(prompt_tokens)

        with self._stream_lock:
            self._reading = "target"
        try:
            if not held():  # (a pause in the typing that added no word reads nothing)
                read = GenerationParams(mode="plain", temperature=0.0, max_tokens=1)  # the first token costs no pass
                yield from self.generate(prompt_tokens, read)
            if held():  # not stopped
                policy = self.policy(replace(params, mode=decoded_mode(params)))
                with self._stream_lock:
                    if self._drafters_stopped:
                        return
                    self._reading = "drafters"
                policy.read_ahead(prompt_tokens)
        finally:
            with self._stream_lock:
                self._reading, self._drafters_stopped = None, False

    # -- the lookup pool: earlier text the pool drafter proposes from ------
    def remember(self, doc: str, tokens: Sequence[int]) -> None:
        """Keep `tokens` in the lookup pool as document `doc` ("conversation:<id>",
        "request:<hash>", "file:<sha256>"), replacing what it held: remembering a
        conversation whole after each turn costs what its new tokens do. Kept between
        runs (written at close); nothing where the pool is off. Not while a reply decodes."""
        self._forget_pending()
        if self._pool is None:
            return
        self._pool.add(doc, tokens)
        if time.monotonic() - self._pool_saved >= POOL_SAVE_S:
            self._save_pool()

    def forget(self, doc: str) -> None:
        """From any thread: remove `doc` from the lookup pool, here (before the next
        reply drafts) and in every pool file in its folder, whatever the tokenizer and
        whether or not the pool is on now (a deleted conversation)."""
        with self._forget_lock:
            self._to_forget.add(doc)
        if self._pool_folder is not None:
            forget_everywhere(self._pool_folder, doc)

    def _forget_pending(self) -> None:
        with self._forget_lock:
            docs, self._to_forget = self._to_forget, set()
        for doc in docs:
            if self._pool is not None:
                self._pool.index.remove(doc)  # the file holds its tombstone: merged at the next save

    def _save_pool(self) -> None:
        if self._pool is not None:
            self._forget_pending()
            self._pool.save()
            self._pool_saved = time.monotonic()

    def interrupt(self) -> None:
        """From any thread: end the reply being generated now. The decode in progress
        (a batch of a long prompt, or a cycle's pass) stops at llama.cpp's next graph
        node, and the stream ends with stop_reason "cancelled"; the caches keep what
        earlier batches read (the next generate reuses it). Between replies, nothing."""
        with self._stream_lock:
            if self._streams:
                self._abort(True)

    def interrupt_drafters_reading(self) -> None:
        """From any thread: end the reading by the drafters of the read() running now,
        keeping what they read, or keep it from beginning. A message sent meanwhile need
        not wait for a draft model catching up (with a reply it sat out, or a file:
        seconds at a long context on a CPU) that its reply may leave out; the target's
        reading goes on, since that prompt needs it (a batch stopped mid-way would be
        read again), and a reply is never stopped by it."""
        with self._stream_lock:
            self._drafters_stopped = self._reading is not None
            if self._reading == "drafters":
                self._abort(True)

    def _interruptible(self, chunks: Iterator[Chunk]) -> Iterator[Chunk]:
        with self._stream_lock:
            if not self._streams:  # (within one, as the target's part of a read(), it is for that one)
                self._abort(False)  # an interrupt was for the replies before this one
            self._streams += 1
        try:
            yield from chunks
        except DecodeAborted:  # interrupt(): the decoder's cleanup has run, the caches are consistent
            return
        finally:
            with self._stream_lock:
                self._streams -= 1
                if not self._streams:
                    self._abort(False)

    def _abort(self, stop: bool) -> None:
        for m in (self._target, self._draft):
            if m is not None:
                m.ctx.abort(stop)

    def reset(self, *, learnt: bool = False) -> None:
        """Forget both KV caches and the snapshots in RAM (the next generate
        evaluates its whole prompt, unless the disk cache holds it); with `learnt`,
        also what auto mode learnt of the drafters and of replies (Policies.forget_learnt):
        the next reply is then what a new session's first costs."""
        self._target.pool.reset()
        if self._draft:
            self._draft.pool.reset()
        if self._cache is not None:
            self._cache.clear()
        if learnt:
            self.policies.forget_learnt()

    # -- lifetime ---------------------------------------------------------
    def describe(self) -> EngineInfo:
        info = system_info()
        models = {"target": self._target}
        if self._draft:
            models["draft"] = self._draft
        return EngineInfo(
            backend=info["backend"],
            gpu_offload=info["gpu_offload"],
            exact=self._target.exact,
            max_verify_batch=self.policies.max_verify_batch() if not self._target.exact  # exact: once probed
            else self.policies.measured_batch or None,
            workers=tuple(str(e) for e in self._target.settings.rpc.workers) if self._target.settings.rpc else (),
            conversations=self._target.ctx.n_seq_max,  # held in the KV caches at once
            cache_ram_mib=self._cache.ram_bytes >> 20 if self._cache else 0,
            cache_disk=str(self._cache.disk) if self._cache and self._cache.disk else None,
            models={
                role: ModelInfo(
                    path=str(m.settings.path),
                    desc=m.model.desc(),
                    n_layer=m.model.n_layer(),
                    # -1 asks for all: the layers and the output layer
                    n_gpu_layers=m.model.n_layer() + 1 if m.settings.n_gpu_layers < 0
                    else min(m.settings.n_gpu_layers, m.model.n_layer() + 1),
                    n_ctx=m.seq.n_ctx,
                    exact=m.exact,
                    flash_attn={True: "on", False: "off", None: "llama.cpp's choice"}[m.ctx.flash_attn],
                    layers=_placement(m.model),
                    huge_pages_mib=m.model.huge_pages >> 20,
                )
                for role, m in models.items()
            },
        )

    def save(self) -> None:
        """Write the conversations the caches hold to the disk cache, if there is one."""
        for m in (self._target, self._draft):
            if m is not None and not (m.model.guard and m.model.guard.lost):
                m.pool.save()

    def close(self) -> None:
        """Save what the caches hold (see save), the lookup pool and auto's calibration as
        healed (Policies.keep_healed), then free the models (a target whose RPC worker
        was lost is abandoned: see LlamaModel.close)."""
        try:
            self.save()
        except Exception as e:  # keeping the reading for next time must never stop a close
            log.warning("could not save the KV caches: %s", e)
        self._save_pool()  # logs its own failures
        self.policies.keep_healed()  # (so does save_costs)
        self._pool = None
        if self._draft:
            self._draft.close()
            self._draft = None
        if self._target:
            self._target.close()
            self._target = None

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

"""Stand-ins for tests: a tiny edgespec.engine.runtime.Engine for pure-logic
tests (and one whose chunks look like speculative cycles, for the app), and a
model library for the app.

Tokens are characters (id = ord(c)); registered special texts such as
"<|im_start|>" are single tokens with ids from SPECIAL_BASE. Like the real
Engine it keeps the tokens of its cache and reports how many prompt tokens it
had to evaluate (everything after the longest common prefix with the cache).
"""

from __future__ import annotations

import threading
import time
from typing import Callable, Iterator

from edgespec.engine.events import Chunk, GenerationParams, Stats
from edgespec.engine.info import EngineInfo, LayerRun, ModelInfo
from edgespec.errors import DownloadError
from edgespec.tui.library import LibraryRow, PullProgress

SPECIAL_BASE = 1_000_000
CHATML = {"bos": "<s>", "eos": "<|im_end|>", "specials": ("<|im_start|>", "<|im_end|>")}
# Qwen2.5's template with its tool section, shortened to the structure that matters: tools
# listed with tojson in the system turn, an assistant's calls as <tool_call> blocks, tool
# results as <tool_response> blocks in a user turn.
QWEN_TOOLS = (
    "{%- if tools %}{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] }}{%- else %}{{- 'You are helpful.' }}{%- endif %}"
    "{{- '\\n\\n# Tools\\n\\n<tools>' }}{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}"
    "{{- '\\n</tools>\\nCall a function within <tool_call></tool_call> tags.<|im_end|>\\n' }}"
    "{%- elif messages[0]['role'] == 'system' %}{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'user' or (message.role == 'system' and not loop.first)"
    " or (message.role == 'assistant' and not message.tool_calls) %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- elif message.role == 'assistant' %}{{- '<|im_start|>' + message.role }}"
    "{%- if message.content %}{{- '\\n' + message.content }}{%- endif %}"
    "{%- for tool_call in message.tool_calls %}"
    "{%- if tool_call.function is defined %}{%- set tool_call = tool_call.function %}{%- endif %}"
    "{{- '\\n<tool_call>\\n{\"name\": \"' }}{{- tool_call.name }}{{- '\", \"arguments\": ' }}"
    "{{- tool_call.arguments | tojson }}{{- '}\\n</tool_call>' }}"
    "{%- endfor %}{{- '<|im_end|>\\n' }}"
    "{%- elif message.role == 'tool' %}"
    "{%- if loop.index0 == 0 or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' }}{{- message.content }}{{- '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)



def model_info(path: str = "fake.gguf", *, n_layer: int = 0, n_gpu_layers: int = 0,
               layers: tuple[LayerRun, ...] = ()) -> ModelInfo:
    """What Engine.describe() says of one model, with what a test does not name left empty."""
    return ModelInfo(path=path, desc="fake", n_layer=n_layer, n_gpu_layers=n_gpu_layers, n_ctx=4096,
                     exact=False, flash_attn="off", layers=layers)


def engine_info(models: dict[str, ModelInfo], *, backend: str = "fake", gpu_offload: bool = False) -> EngineInfo:
    """What Engine.describe() says, for `models` by role."""
    return EngineInfo(backend=backend, gpu_offload=gpu_offload, exact=False, max_verify_batch=None, workers=(),
                      conversations=1, cache_ram_mib=0, cache_disk=None, models=models)

class FakeEngine:
    """Deterministic engine: replies "reply 1", "reply 2", ... (or `reply(prompt_text)`)."""

    def __init__(self, *, n_ctx: int = 4096, chat_template: str | None = None,
                 specials: tuple[str, ...] = CHATML["specials"], bos_text: str = CHATML["bos"],
                 eos_text: str = CHATML["eos"], reply: Callable[[str], str] | None = None,
                 delay_s: float = 0.0, has_draft: bool = False, hold: threading.Event | None = None,
                 hold_after: int = 0, fim: tuple[str, str, str] | None = None):
        """`fim`: the texts of fill-in-the-middle tokens (prefix, suffix, middle), special tokens too."""
        self.n_ctx = n_ctx
        self.chat_template = chat_template
        self.has_draft = has_draft
        self._specials = {text: SPECIAL_BASE + i
                          for i, text in enumerate((bos_text, eos_text, *specials, *(fim or ())))}
        self.bos = self._specials[bos_text]
        self.eos = self._specials[eos_text]
        self.fim_tokens = tuple(self._specials[text] for text in fim) if fim else None
        self._reply = reply
        self._delay_s = delay_s
        self._hold = hold
        self._hold_after = hold_after
        """With `hold`, a reply pauses after `hold_after` characters until the test sets it:
        a test sees the reply mid-stream however slow the machine."""
        self.cache: list[int] = []
        self.prompts: list[list[int]] = []
        """The prompt tokens of every generate() call, in order."""
        self.regions: list[tuple] = []
        """The prompt regions of every generate() call, in order."""
        self.interrupts = 0
        """interrupt() calls (the real engine stops the decode in progress)."""
        self.drafters_interrupts = 0
        """interrupt_drafters_reading() calls (the real engine stops a read()'s drafters' part)."""
        self.remembered: dict[str, list[int]] = {}
        """The lookup pool: what remember() was given last for each document."""
        self.forgotten: list[str] = []
        """forget() calls, in order."""
        self.reads: list[tuple[list[int], GenerationParams]] = []
        """The tokens and params of every read() call, in order."""
        self.closed = False
        self.generating = False
        self.closed_while_generating = False

    # -- tokenizer ---------------------------------------------------------------------
    def token_text(self, token: int) -> str:
        for text, tid in self._specials.items():
            if tid == token:
                return text
        return chr(token)

    def tokenize(self, text: str, *, add_bos: bool = False, special: bool = True) -> list[int]:
        tokens = [self.bos] if add_bos else []
        i = 0
        while i < len(text):
            match = special and next((s for s in self._specials if text.startswith(s, i)), None)
            if match:
                tokens.append(self._specials[match])
                i += len(match)
            else:
                tokens.append(ord(text[i]))
                i += 1
        return tokens

    def detokenize(self, tokens: list[int]) -> str:
        return "".join(self.token_text(t) for t in tokens)

    # -- generation --------------------------------------------------------------------
    def interrupt(self) -> None:
        self.interrupts += 1

    def interrupt_drafters_reading(self) -> None:
        self.drafters_interrupts += 1

    def remember(self, doc: str, tokens) -> None:
        self.remembered[doc] = list(tokens)

    def forget(self, doc: str) -> None:
        self.forgotten.append(doc)
        self.remembered.pop(doc, None)

    def generate(self, prompt_tokens: list[int], params: GenerationParams, *, regions=()) -> Iterator[Chunk]:
        self.generating = True
        self.regions.append(tuple(regions))
        try:
            yield from self._generate(prompt_tokens, params)
        finally:
            self.generating = False

    def read(self, prompt_tokens: list[int], params: GenerationParams) -> Iterator[Chunk]:
        """Takes the tokens into its cache, as the real engine reads a prompt's start;
        `reads` keeps each call's tokens and params (their mode: whether a draft model reads)."""
        self.reads.append((list(prompt_tokens), params))
        self.cache = list(prompt_tokens)
        yield Chunk("", stats=Stats(mode="plain", prompt_tokens=len(prompt_tokens)))

    def _generate(self, prompt_tokens: list[int], params: GenerationParams) -> Iterator[Chunk]:
        prompt = list(prompt_tokens)
        self.prompts.append(prompt)
        common = 0
        while common < min(len(prompt), len(self.cache)) and prompt[common] == self.cache[common]:
            common += 1
        stats = Stats(mode=params.mode, prompt_tokens=len(prompt), prompt_evaluated=len(prompt) - common)
        self.cache = prompt
        text = self._reply(self.detokenize(prompt)) if self._reply else f"reply {len(self.prompts)}"
        finish = "eog"
        for i, ch in enumerate(text):
            if len(self.cache) >= self.n_ctx:
                finish = "context"
                break
            if params.max_tokens is not None and i >= params.max_tokens:
                finish = "max_tokens"
                break
            if self._hold is not None and i == self._hold_after:
                self._hold.wait(timeout=30)
            if self._delay_s:
                time.sleep(self._delay_s)
            stats.generated_tokens += 1
            stats.target_passes += 1
            if stats.ttft_s is None:
                stats.ttft_s = 0.001
            self.cache = self.cache + [ord(ch)]
            yield Chunk(text=ch, tokens=[ord(ch)], from_draft=[i % 2 == 1], stats=stats)
        stats.stop_reason = finish
        yield Chunk(text="", stats=stats, finish_reason=finish)

    def describe(self) -> EngineInfo:
        return engine_info({"target": model_info()})

    def reset(self) -> None:
        self.cache = []

    def close(self) -> None:
        self.closed_while_generating |= self.generating  # a real engine would free memory a decode is using
        self.closed = True

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class SpecFakeEngine(FakeEngine):
    """FakeEngine whose chunks look like speculative cycles: up to 3 accepted draft
    tokens then one target token, with deterministic statistics. With `sources`, the
    accepted tokens are credited in Stats.accepted_by to "draft", and every other
    cycle's to lookup in the prompt's last region ("lookup/<label>"), or
    "lookup/prompt" without regions (off by default: the app's snapshots show none)."""

    sources = False

    def generate(self, prompt_tokens: list[int], params: GenerationParams, *, regions=()):
        inner = super().generate(prompt_tokens, params, regions=regions)
        stats = Stats(mode=params.mode, k=3, drafter="draft", reason="acceptance 75%")
        lookup = f"lookup/{regions[-1].label}" if regions else "lookup/prompt"
        pending: list[Chunk] = []
        try:
            for chunk in inner:
                if chunk.finish_reason is None:
                    pending.append(chunk)
                    if len(pending) < 4:
                        continue
                if pending:
                    source = (lookup if stats.target_passes % 2 else "draft") if self.sources else ""
                    yield self._cycle(pending, stats, source)
                    pending = []
                if chunk.finish_reason:
                    stats.stop_reason = chunk.finish_reason
                    yield Chunk(text="", stats=stats, finish_reason=chunk.finish_reason)
        finally:
            inner.close()

    @staticmethod
    def _cycle(chunks: list[Chunk], stats: Stats, source: str) -> Chunk:
        n = len(chunks)
        stats.generated_tokens += n
        stats.target_passes += 1
        stats.drafted += 3
        stats.accepted += n - 1
        if n > 1 and source:
            stats.accepted_by[source] = stats.accepted_by.get(source, 0) + n - 1
        stats.decode_s = 0.01 * stats.generated_tokens
        return Chunk(text="".join(c.text for c in chunks), tokens=[t for c in chunks for t in c.tokens],
                     from_draft=[True] * (n - 1) + [False], stats=stats)


class FakeLibrary:
    """Two models and a pair; pulls report progress in 10 steps of 100 MB."""

    def __init__(self, *, fail: str | None = None, step_s: float = 0.02):
        self.installed = {"tiny-target": True, "tiny-draft": False}
        self.fail = fail
        self.step_s = step_s
        self.pull_ended = threading.Event()

    def rows(self):
        pair_installed = all(self.installed.values())
        return [
            LibraryRow("tiny-pair", "pair", pair_installed, 1_500_000_000, "tiny-target + tiny-draft", "the test pair"),
            LibraryRow("tiny-target", "model", self.installed["tiny-target"], 1_000_000_000, "hub test/tiny", "target"),
            LibraryRow("tiny-draft", "model", self.installed["tiny-draft"], 500_000_000, "hub test/draft", "draft"),
        ]

    def pull(self, name, *, progress):
        self.pull_ended.clear()
        try:
            total = 1_000_000_000
            for i in range(1, 11):
                time.sleep(self.step_s)
                if self.fail and i == 3:
                    raise DownloadError(self.fail)
                progress(PullProgress(done=i * total // 10, total=total, speed=50e6, eta=(10 - i) * 2.0, what=name))
            self.installed[name] = True
        finally:
            self.pull_ended.set()

    def resolve(self, name, *, progress=None):
        return f"/models/{name}.gguf"

    def pair(self, name):
        return ("tiny-target", "tiny-draft")

    def decoding(self, name):
        return ("draft", 3)


class SlowReader(FakeEngine):
    """Reads every prompt for `batches` batches of 50 ms (with `later`, every prompt after
    the first for that many), each reported by an empty chunk (as the engine reports a
    long prompt), then replies. interrupt() ends a reading in progress at its next batch,
    as the engine's does (and between replies does nothing)."""

    def __init__(self, batches: int, *, later: int | None = None, **kwargs):
        super().__init__(**kwargs)
        self.batches = batches
        self.later = batches if later is None else later
        self.batches_read = []
        self.reading = threading.Event()
        """Set once the first batch is read."""
        self.ended = threading.Event()
        """Set when a generate() or read() call has ended, read to the end or not."""
        self._reading_prompt = False
        self._stop = threading.Event()

    def interrupt(self) -> None:
        super().interrupt()
        if self._reading_prompt:
            self._stop.set()

    def generate(self, prompt_tokens, params, *, regions=()):
        try:
            if (yield from self._slowly(prompt_tokens)):
                yield from super().generate(prompt_tokens, params, regions=regions)
        finally:
            self.ended.set()

    def read(self, prompt_tokens, params):
        try:
            if (yield from self._slowly(prompt_tokens)):
                yield from super().read(prompt_tokens, params)
        finally:
            self.ended.set()

    def _slowly(self, prompt_tokens):
        """The batches of reading a prompt; whether they were all read (not interrupted)."""
        self._stop.clear()
        batches = self.later if self.batches_read else self.batches
        read = 0
        self._reading_prompt = True
        try:
            for read in range(1, batches + 1):
                if self._stop.is_set():
                    return False
                time.sleep(0.05)
                self.reading.set()
                yield Chunk("", stats=Stats(prompt_tokens=len(prompt_tokens), prompt_evaluated=read * 512))
            return True
        finally:
            self._reading_prompt = False
            self.batches_read.append(read)


class SlowDraftReader(FakeEngine):
    """Reads ahead as the engine does: the target for `target_batches` batches of 50 ms
    (interrupt() ends it at its next batch), then the draft model for 200 (10 s), which
    interrupt_drafters_reading() ends at its next batch, or keeps from beginning when it
    comes during the target's part."""

    def __init__(self, *, target_batches: int = 0, **kwargs):
        super().__init__(**kwargs)
        self.target_batches = target_batches
        self.target_reading = threading.Event()
        """Set once the target's reading has begun."""
        self.drafting_read = threading.Event()
        """Set once the draft model's reading has begun."""
        self.target_batches_read: list[int] = []
        self.draft_batches_read: list[int] = []
        self._stop = threading.Event()
        self._skip_drafters = threading.Event()
        self._reading = False

    def interrupt(self) -> None:
        super().interrupt()
        self._stop.set()

    def interrupt_drafters_reading(self) -> None:
        super().interrupt_drafters_reading()
        if self._reading:
            self._skip_drafters.set()

    def read(self, prompt_tokens, params):
        self._stop.clear()
        self._skip_drafters.clear()
        self._reading = True
        try:
            if (yield from self._batches(self.target_batches, self.target_batches_read, self.target_reading,
                                         self._stop)):
                yield from super().read(prompt_tokens, params)
                yield from self._batches(200, self.draft_batches_read, self.drafting_read, self._skip_drafters)
        finally:
            self._reading = False

    def _batches(self, n, counts, started, stop):
        """n batches of 50 ms, each reported by an empty chunk; whether all were read."""
        read = 0
        try:
            for read in range(1, n + 1):
                if stop.is_set() or self._stop.is_set():
                    read -= 1
                    return False
                started.set()
                time.sleep(0.05)
                yield Chunk("", stats=Stats(prompt_evaluated=read))
            return True
        finally:
            counts.append(read)

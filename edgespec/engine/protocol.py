"""What the layers above use of an Engine (engine/runtime.py), as one small
interface: the chat session, the app and the server are written against it,
and tests pass fakes that provide just this."""

from __future__ import annotations

from typing import Iterator, Protocol, Sequence

from edgespec.engine.events import Chunk, GenerationParams
from edgespec.engine.info import EngineInfo
from edgespec.engine.regions import Region


class ChatEngine(Protocol):
    @property
    def n_ctx(self) -> int:
        """Tokens the context holds: prompt and reply together."""

    @property
    def bos(self) -> int | None: ...

    @property
    def eos(self) -> int | None: ...

    @property
    def fim_tokens(self) -> tuple[int, int, int] | None:
        """The target's fill-in-the-middle tokens (prefix, suffix, middle); None where it lacks one."""

    @property
    def chat_template(self) -> str | None:
        """The GGUF's own Jinja chat template, if it has one."""

    def token_text(self, token: int) -> str: ...

    def tokenize(self, text: str, *, add_bos: bool = False, special: bool = True) -> list[int]: ...

    def detokenize(self, tokens: Sequence[int]) -> str: ...

    def generate(self, prompt_tokens: Sequence[int], params: GenerationParams, *,
                 regions: Sequence[Region] = ()) -> Iterator[Chunk]:
        """Stream the reply to `prompt_tokens`, one Chunk per decode cycle. `regions`:
        labelled spans of the prompt (chat/prompt.py: Prompt.regions), to which
        Stats.accepted_by credits the lookup matches found in them."""

    def read(self, prompt_tokens: Sequence[int], params: GenerationParams) -> Iterator[Chunk]:
        """Read the start of a prompt not sent yet into the caches (the target's, and
        the draft model's where params' mode drafts with it), replying nothing: the
        reply to a prompt that starts with it reads only the rest. Interruptible."""

    def remember(self, doc: str, tokens: Sequence[int]) -> None:
        """Keep `tokens` in the lookup pool as document `doc` ("conversation:<id>",
        "request:<hash>", "file:<sha256>"), replacing what it held: earlier text the
        pool drafter proposes from, in this run and later ones. Nothing where it is off."""

    def forget(self, doc: str) -> None:
        """From any thread: remove `doc` from the lookup pool, here and in its files."""

    def interrupt(self) -> None:
        """From any thread: end the reply being generated now (a long prompt's read
        stops mid-batch); the stream ends with stop_reason "cancelled"."""

    def interrupt_drafters_reading(self) -> None:
        """From any thread: end, or keep from beginning, the reading by the drafters of
        the read() running now (its target's reading and a reply go on)."""

    def describe(self) -> EngineInfo:
        """Where the models run: the backend and, per model, its file and GPU layers."""

    def close(self) -> None: ...

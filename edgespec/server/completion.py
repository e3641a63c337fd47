"""What a request runs on the engine (on the worker thread): the prompt's tokens,
the generation, and what the response needs from it.

Chat messages become tokens in the chat layer (PromptEncoder), as they do for
the app and the CLI, extending what the KV caches hold: a client that resends
the whole conversation each turn pays for the new message only.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Mapping, Sequence

from edgespec.chat.prompt import Prompt, PromptEncoder, Region
from edgespec.chat.remember import request_doc
from edgespec.chat.words import stats_line
from edgespec.engine.events import GenerationParams, Stats
from edgespec.engine.protocol import ChatEngine
from edgespec.errors import ContextFullError, NoFimTokensError, ToolsNotTakenError

log = logging.getLogger("edgespec.server")

FINISH_REASONS = {"eog": "stop", "stop": "stop", "max_tokens": "length", "context": "length"}
"""The engine's reasons for ending a reply, in OpenAI's words."""


@dataclass
class Delta:
    """New reply text."""

    text: str


@dataclass
class Done:
    """The reply's end: its last text, why it ended, and the engine's statistics."""

    text: str
    finish_reason: str
    stats: Stats


def fim_prompt(engine: ChatEngine, prefix: str, suffix: str, *, model: str = "the model") -> list[int]:
    """The prompt that asks the model for the text between `prefix` and `suffix`:
    BOS as a raw prompt has it, then each text after its fill-in-the-middle token,
    then the middle token, after which the model writes the gap (prefix, suffix,
    middle: llama-server's infill order). Both texts are the user's, tokenized as
    plain text: a file holding "<|fim_middle|>" cannot end its part or open the
    middle. Raises NoFimTokensError for a model without these tokens."""
    tokens = engine.fim_tokens  # (three calls into the vocabulary: asked once)
    if tokens is None:
        raise NoFimTokensError(f"'suffix' is not supported: {model} has no fill-in-the-middle tokens "
                               f"(serve a model that has them, such as a coder model, or send no suffix)")
    pre, suf, mid = tokens
    return [*engine.tokenize("", add_bos=True), pre, *engine.tokenize(prefix, special=False),
            suf, *engine.tokenize(suffix, special=False), mid]


class Completer:
    """The engine as the server uses it. Owns the engine: closing this closes it."""

    def __init__(self, engine, *, template: str | None = None):
        """`template`: a built-in chat format's name for a model whose GGUF has none."""
        self.engine = engine
        self.files = {role: Path(m.path).name for role, m in engine.describe().models.items()}
        """The GGUF file names served, by role ("target", "draft")."""
        self._encoder = PromptEncoder(engine, template=template, model=self.files["target"])
        """Without a usable template raw completions still work; chat requests are told why not."""
        self._ahead: tuple[list[int], GenerationParams] | None = None
        """What the next request likely starts with (the last prompt and its reply), and
        the reply's params, until read ahead."""

    @property
    def n_ctx(self) -> int:
        return self.engine.n_ctx

    def chat(self, messages: Sequence[Mapping[str, str]], params: GenerationParams, *,
             tools: Sequence[Mapping] | None = None, request_id: str = "") -> Iterator[Delta | Done]:
        """Stream the assistant's reply to `messages` (dicts with "role" and "content", and
        what else ChatTemplate.render reads), offering the model `tools`. Raises
        ToolsNotTakenError for tools a template would drop: the model would answer as if
        it had none."""
        if tools and not self._encoder.template.takes_tools:
            raise ToolsNotTakenError(
                f"'tools' is not supported: this model's chat template does not take tools ({self.files['target']}); "
                f"serve a model whose template does (Qwen2.5's), start the server with a --template that does, "
                f"or send tool_choice 'none'")
        prompt = self._encoder.encode(messages, tools=tools)
        return self._generate(prompt, prompt.tokens, prompt.params(params), request_id, regions=prompt.regions,
                              doc=request_doc(messages))

    def complete(self, prompt: str | list[int], params: GenerationParams, *, suffix: str | None = None,
                 request_id: str = "") -> Iterator[Delta | Done]:
        """Stream the continuation of a raw prompt (text, special tokens parsed, or token ids);
        with a `suffix`, the text between a text prompt and it (`fim_prompt`)."""
        if suffix:
            if not isinstance(prompt, str):
                raise ValueError("a suffix needs a text prompt, not token ids")
            tokens = fim_prompt(self.engine, prompt, suffix, model=self.files["target"])
            return self._generate(None, tokens, params, request_id, doc=request_doc(tokens))
        if isinstance(prompt, list):
            return self._generate(None, prompt, params, request_id, doc=request_doc(prompt))
        encoded = self._encoder.encode_text(prompt)
        return self._generate(encoded, encoded.tokens, params, request_id, doc=request_doc(encoded.tokens))

    def _generate(self, prompt: Prompt | None, tokens: list[int], params: GenerationParams,
                  request_id: str, *, regions: Sequence[Region] = (), doc: str) -> Iterator[Delta | Done]:
        """`prompt`: what `tokens` encode, kept for reuse; None for token ids from the client.
        `doc`: the lookup pool's document the request and its reply are remembered as."""
        n_ctx = self.engine.n_ctx
        if len(tokens) >= n_ctx:
            raise ContextFullError(
                f"This model's maximum context length is {n_ctx} tokens, but the prompt has {len(tokens)} "
                f"tokens. Shorten the prompt, or restart the server with a larger context (--ctx).")
        self._ahead = None
        stream = self.engine.generate(tokens, params, regions=regions)
        return self._stream(stream, prompt, request_id, doc, tokens, params)

    def _stream(self, stream, prompt, request_id, doc, tokens, params) -> Iterator[Delta | Done]:
        reply, reply_tokens, stats, ended = [], [], None, None
        try:
            for chunk in stream:
                if stats is None:
                    log.info("%s: started", request_id)  # its first chunk (a batch of the prompt read, or a token)
                stats = chunk.stats
                reply.append(chunk.text)
                reply_tokens += chunk.tokens
                if chunk.finish_reason:
                    ended = chunk.finish_reason
                    yield Done(chunk.text, FINISH_REASONS.get(chunk.finish_reason, "stop"), stats)
                else:  # empty while a long prompt is read: each is a point where a client gone is noticed
                    yield Delta(chunk.text)
        finally:
            stream.close()  # the engine's caches are consistent from here on
            if prompt is not None:
                self._encoder.remember(prompt, "".join(reply), reply_tokens)
            self.engine.remember(doc, [*tokens, *reply_tokens])
            ahead = [*tokens, *reply_tokens]
            if ended not in (None, "cancelled", "context") and len(ahead) < self.engine.n_ctx:
                self._ahead = (ahead, params)  # (a conversation that fills the context has no next request)
            if stats is not None:
                log.info("%s: %d prompt tokens (%d evaluated); %s", request_id, stats.prompt_tokens,
                         stats.prompt_evaluated, stats_line(stats))

    def read_ahead(self) -> Iterator[object]:
        """Read the last prompt and its reply into the models, in the reply's mode
        (Engine.read), once: the server's idle work (EngineThread). An editor's or
        agent's next request starts with them and comes seconds later (a person reads
        the reply, a tool runs); read then, they would hold it up (a draft model that
        sat the reply out reads it all before its first draft). The chat reads each
        reply ahead the same way."""
        if self._ahead is not None:
            (tokens, params), self._ahead = self._ahead, None
            yield from self.engine.read(tokens, params)

    def interrupt(self) -> None:
        """From any thread: end the reply in progress now (Engine.interrupt)."""
        self.engine.interrupt()

    def close(self) -> None:
        self.engine.close()

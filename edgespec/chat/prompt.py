"""How a conversation becomes the tokens a model reads, for every face.

The rule is written once, here: render the messages with the chat template,
add BOS unless the template wrote it, parse special texts, and end the reply at
the template's stop strings. The CLI, the server and the chat session all call
`PromptEncoder.encode`; its prefix tokenizer keeps the tokens of earlier
prompts and replies, so a conversation that grows pays for its new text only.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Mapping, Sequence

from edgespec.chat.prefix import PrefixTokenizer
from edgespec.chat.template import ChatTemplate, chat_template
from edgespec.engine.events import GenerationParams
from edgespec.engine.protocol import ChatEngine
from edgespec.errors import TemplateError


@dataclass(frozen=True)
class Prompt:
    """A prompt as the engine reads it."""

    text: str
    """The rendered text (what the tokens spell, for logs and the prefix tokenizer)."""
    tokens: list[int]
    stop: tuple[str, ...] = ()
    """Stop strings the template needs, beyond the caller's."""

    def params(self, params: GenerationParams) -> GenerationParams:
        """`params` with this prompt's stop strings added."""
        return dataclasses.replace(params, stop=(*params.stop, *self.stop)) if self.stop else params


class PromptEncoder:
    """Turns conversations into prompts for one engine, reusing the tokens of
    earlier prompts and replies that the engine's caches hold."""

    def __init__(self, engine: ChatEngine, *, template: str | None = None, model: str = "the model"):
        """`template`: a built-in format's name (or Jinja source) to use instead of the
        model's own. A model without a usable template still encodes raw text; its
        TemplateError is raised by `template` and `encode`."""
        self.engine = engine
        try:
            self._template: ChatTemplate | TemplateError = chat_template(engine, template=template, model=model)
        except TemplateError as e:
            self._template = e
        self._prefix = PrefixTokenizer(engine)

    @property
    def template(self) -> ChatTemplate:
        """The chat template conversations are rendered with; raises TemplateError when there is none."""
        if isinstance(self._template, TemplateError):
            raise self._template
        return self._template

    def encode(self, messages: Sequence[Mapping[str, str]], *, add_generation_prompt: bool = True) -> Prompt:
        """The prompt for `messages` (dicts with "role" and "content")."""
        template = self.template
        text = template.render(messages, add_generation_prompt=add_generation_prompt)
        return Prompt(text, self._prefix.tokenize(text, add_bos=template.needs_bos(text)), template.stop)

    def encode_text(self, text: str) -> Prompt:
        """A raw prompt (no template; special texts parsed, BOS added)."""
        return Prompt(text, self._prefix.tokenize(text, add_bos=True))

    def remember(self, prompt: Prompt, reply_text: str, reply_tokens: Sequence[int]) -> None:
        """Keep `prompt` and its reply, as the engine's caches now hold them, for a later prompt."""
        self._prefix.remember(prompt.text, prompt.tokens, reply_text, reply_tokens)


def encode_prompt(engine: ChatEngine, prompt: str, *, raw: bool = False, system: str | None = None,
                  template: str | None = None) -> tuple[list[int], tuple[str, ...]]:
    """The tokens of a one-message chat: `prompt` as the user's message (after a
    `system` message if given), rendered with `engine`'s template or the built-in
    format `template` names; with `raw`, the prompt itself. And the stop strings
    the template needs (none for a raw prompt)."""
    if raw:
        return engine.tokenize(prompt, add_bos=True, special=False), ()
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]
    encoded = PromptEncoder(engine, template=template).encode(messages)
    return encoded.tokens, encoded.stop

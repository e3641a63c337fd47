"""How a conversation becomes the tokens a model reads, for every face.

The rule is written once, here: render the messages with the chat template,
add BOS unless the template wrote it, and end the reply at the template's stop
strings. Only the template's own text is parsed for special texts: its markers
become control tokens, while each message's content is tokenized as plain text,
so a message (or a file pasted into one) holding "<|im_end|>" cannot end its
turn or open another. The CLI, the server and the chat session all call
`PromptEncoder.encode`; its prefix tokenizer keeps the tokens of earlier
prompts and replies, so a conversation that grows pays for its new text only.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Mapping, Sequence

from edgespec.chat.prefix import PrefixTokenizer, Stretch, Tokenized
from edgespec.chat.template import BUILTIN_FORMATS, ChatTemplate, Placed, Rendered, chat_template
from edgespec.engine.events import GenerationParams
from edgespec.engine.protocol import ChatEngine
from edgespec.engine.regions import Region
from edgespec.errors import TemplateError


@dataclass(frozen=True)
class Prompt:
    """A prompt as the engine reads it."""

    text: str
    """The rendered text (what the tokens spell, for logs and the prefix tokenizer)."""
    tokens: list[int]
    stop: tuple[str, ...] = ()
    """Stop strings the template needs, beyond the caller's."""
    regions: tuple[Region, ...] = ()
    """Where each message's content is, in message order, each followed by the regions
    of its "spans"; a message the template left out, or whose content is empty, has
    none. A region's label is the message's "label" if it has one (e.g.
    "file:src/app.py"), else "system" for a system message and "<role>:<index in the
    messages>" for others ("user:3"); the engine credits lookup matches to it. Empty
    for a raw prompt, and for a conversation whose layout could not be read (see
    `PromptEncoder.encode`)."""
    tokenized: Tokenized | None = field(default=None, repr=False, compare=False)
    """How the text was laid out for its tokens (for the prefix tokenizer)."""

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

    def encode(self, messages: Sequence[Mapping[str, str]], *, add_generation_prompt: bool = True,
               tools: Sequence[Mapping] | None = None) -> Prompt:
        """The prompt for `messages`: dicts with "role" and "content", and optionally
        "label", the name of its content's region, and "spans", labelled parts of
        the content as (start, end, label) in its characters (a file in a message),
        each a region of its own after the content's. `tools`: function definitions offered
        to a template that takes them (ChatTemplate.render).

        Each content is found where the template put it (`ChatTemplate.render_placed`)
        and tokenized as plain text; the rest is the template's and is parsed for
        special texts. Where that cannot be trusted, special texts in a content
        would become control tokens, so the conversation is accepted only if none
        of the contents concerned holds one (then it makes no difference), else
        TemplateError:
        - a content the template rewrote (not found as it is, or stripped) is
          tokenized as text where it stands, but it may not hold special texts;
        - a layout that cannot be read (the template's text depends on the
          contents, or what stands in a rewritten content's place holds special
          texts, which only the template can have written) gives the whole text
          special parsing, as a raw prompt, and no regions; no content may hold
          special texts then.
        """
        template = self.template
        self._check_tools(messages, tools)
        rendered = template.render_placed(messages, add_generation_prompt=add_generation_prompt, tools=tools)
        if rendered.aligned and not any(rendered.placed) and any(m["content"] for m in messages):
            raise TemplateError(  # it reads a variable it is not given, or is not a chat template at all
                f"The chat template of {template.model} shows none of the messages of the conversation. "
                f"Choose a built-in format with --template instead: {', '.join(BUILTIN_FORMATS)}.")
        placed = self._placed(messages, rendered)
        text = rendered.text
        content_first = any(p is not None and p.start == 0 for p in placed)  # its "<s>" is text, not the BOS
        tokenized = self._prefix.tokenize(text, _stretches(text, placed),
                                          add_bos=template.needs_bos(text) or content_first)
        regions = tuple(Region(*self._prefix.tokens_of(text, tokenized, start, end), label)
                        for start, end, label in _labelled(messages, placed, text))
        return Prompt(text, tokenized.tokens, template.stop, regions=regions, tokenized=tokenized)

    def encode_text(self, text: str) -> Prompt:
        """A raw prompt (no template; special texts parsed, BOS added): the user's own full text."""
        tokenized = self._prefix.tokenize(text, add_bos=True)
        return Prompt(text, tokenized.tokens, tokenized=tokenized)

    def remember(self, prompt: Prompt, reply_text: str, reply_tokens: Sequence[int]) -> None:
        """Keep `prompt` and its reply, as the engine's caches now hold them, for a later prompt."""
        tokenized = prompt.tokenized or Tokenized(prompt.tokens, (Stretch(0, len(prompt.text), special=True),), {})
        self._prefix.remember(prompt.text, tokenized, reply_text, reply_tokens)

    def _placed(self, messages: Sequence[Mapping[str, str]], rendered: Rendered) -> tuple[Placed | None, ...]:
        """Where the contents are tokenized as text (see `encode`); raises TemplateError
        for a content holding special texts that cannot be kept text."""
        placed = rendered.placed
        rewritten = [p for p in placed if p is not None and not p.verbatim]
        readable = rendered.aligned and not any(self._holds_special(rendered.text[p.start:p.end]) for p in rewritten)
        for index, (message, where) in enumerate(zip(messages, placed)):
            kept_text = readable and (where is None or where.verbatim)  # left out, or text where it stands
            content = message["content"]
            if not kept_text and isinstance(content, str) and self._holds_special(content):
                raise TemplateError(
                    f"Message {index + 1} ({message['role']}) holds the text of special tokens, and the chat "
                    f"template of {self.template.model} does not show it as it is, so that text could act as the "
                    f"template's markers. Remove it from the message, or choose a built-in format with --template.")
        return placed if readable else (None,) * len(messages)

    def _check_tools(self, messages: Sequence[Mapping], tools: Sequence[Mapping] | None) -> None:
        """Raises TemplateError where the tools offered, or the calls an assistant made, hold
        special texts: the template writes them as its own text, whose special texts are markers."""
        calls = [m["tool_calls"] for m in messages if m.get("tool_calls")]
        if (tools or calls) and self._holds_special(json.dumps([tools, calls], ensure_ascii=False)):
            raise TemplateError(
                "The tools offered, or the tool calls in the conversation, hold the text of special tokens, which "
                f"the chat template of {self.template.model} would write as its markers. Remove it from them.")

    def _holds_special(self, content: str) -> bool:
        """Whether some text in `content` tokenizes as a special token when special texts are parsed."""
        return (self.engine.tokenize(content, add_bos=False, special=True)
                != self.engine.tokenize(content, add_bos=False, special=False))


def _stretches(text: str, placed: Sequence[Placed | None]) -> list[Stretch]:
    """The template's text (special texts parsed) and the placed contents (plain
    text), in order, covering `text`."""
    stretches, pos = [], 0
    for where in sorted((p for p in placed if p is not None), key=lambda p: p.start):
        stretches += [Stretch(pos, where.start, special=True), Stretch(where.start, where.end, special=False)]
        pos = where.end
    return [*stretches, Stretch(pos, len(text), special=True)]


def _labelled(messages: Sequence[Mapping], placed: Sequence[Placed | None],
              text: str) -> list[tuple[int, int, str]]:
    """The characters of each placed content in `text`, labelled, each followed by its
    labelled spans. A span needs its content as it is (or stripped: the span is cut
    to what is left); a rewritten content's spans have no region."""
    found = []
    for index, (message, where) in enumerate(zip(messages, placed)):
        if where is None:
            continue
        found.append((where.start, where.end, _label(index, message)))
        if where.verbatim and message.get("spans"):
            offset = where.start - message["content"].find(text[where.start:where.end])  # text position of char 0
            for start, end, label in message["spans"]:
                start, end = (min(max(offset + c, where.start), where.end) for c in (start, end))
                found.append((start, max(start, end), label))
    return found


def _label(index: int, message: Mapping) -> str:
    if message.get("label"):
        return message["label"]
    return "system" if message["role"] == "system" else f"{message['role']}:{index}"


def encode_prompt(engine: ChatEngine, prompt: str, *, raw: bool = False, system: str | None = None,
                  template: str | None = None, model: str = "the model") -> Prompt:
    """A one-message chat: `prompt` as the user's message (after a `system` message
    if given), rendered with `engine`'s template or the built-in format `template`
    names (`model`: its file, as errors name it); with `raw`, the prompt itself, as the
    server's raw completions read it (`PromptEncoder.encode_text`)."""
    encoder = PromptEncoder(engine, template=template, model=model)
    if raw:
        return encoder.encode_text(prompt)
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]
    return encoder.encode(messages)

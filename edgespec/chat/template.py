"""Chat templates: turn a conversation into the prompt text a model was trained on.

A GGUF carries its template as Jinja source (`tokenizer.chat_template`). It
comes from a downloaded file, so it is untrusted: it is rendered in Jinja's
sandbox, with the same helpers Hugging Face transformers gives templates
(`raise_exception`, `strftime_now`, a `tojson` filter that keeps non-ASCII).
A model without a template gets one of the built-in formats, but only when
the user names it: a guessed format would be silently wrong.
"""

from __future__ import annotations

import functools
import json
import math
import re
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from collections.abc import Iterator, MappingView
from typing import Mapping, Sequence

import jinja2
import jinja2.ext
import jinja2.meta
from jinja2 import Environment
from jinja2 import nodes
from jinja2.nodes import EvalContext
from jinja2.runtime import Context, LoopContext
from jinja2.sandbox import ImmutableSandboxedEnvironment, SandboxedFormatter
from jinja2.visitor import NodeTransformer

from edgespec.engine.protocol import ChatEngine
from edgespec.errors import TemplateError, one_line

BUILTIN_FORMATS: dict[str, str] = {
    "chatml": (
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    ),
    "llama3": (
        "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m.role }}<|end_header_id|>\n\n"
        "{{ m.content }}<|eot_id|>{% endfor %}"
        "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
    ),
    # Gemma has no system role: the system prompt opens the first user turn.
    "gemma": (
        "{{ bos_token }}{% set system = namespace(text='') %}"
        "{% for m in messages %}{% if m.role == 'system' %}{% set system.text = m.content + '\\n\\n' %}"
        "{% else %}<start_of_turn>{{ 'model' if m.role == 'assistant' else 'user' }}\n"
        "{% if m.role == 'user' %}{{ system.text }}{% set system.text = '' %}{% endif %}"
        "{{ m.content }}<end_of_turn>\n{% endif %}{% endfor %}"
        "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
    ),
    "plain": (
        "{% for m in messages %}{% if m.role == 'system' %}{{ m.content }}\n\n"
        "{% elif m.role == 'user' %}User: {{ m.content }}\n\n"
        "{% else %}Assistant:{{ '' if m.content[:1] == ' ' else ' ' }}{{ m.content }}\n\n{% endif %}{% endfor %}"
        "{% if add_generation_prompt %}Assistant:{% endif %}"
    ),
}
"""Fallback formats for models whose GGUF has no chat template, chosen by name."""

BUILTIN_STOPS: dict[str, tuple[str, ...]] = {
    "chatml": ("<|im_end|>",),
    "llama3": ("<|eot_id|>",),
    "gemma": ("<end_of_turn>",),
    "plain": ("\nUser:",),
}
"""Stop strings that end a reply in each built-in format, for models whose
vocabulary does not mark the format's end-of-turn token as end-of-generation."""


TEMPLATE_KEYS = ("role", "content", "tool_calls", "tool_call_id")
"""What of a message a template is given (others, such as a region's label, are edgespec's own)."""


@dataclass(frozen=True)
class ChatTemplate:
    """A compiled chat template and the special texts it is rendered with."""

    source: str
    name: str
    """What the template is: "gguf" for the model's own, or a built-in format's name."""
    model: str = "the model"
    """The model's name, for error messages."""
    bos_token: str = ""
    eos_token: str = ""
    stop: tuple[str, ...] = ()
    """Extra stop strings this format needs (built-in formats only)."""

    def needs_bos(self, text: str) -> bool:
        """Whether the tokenizer must add BOS to `text`, rendered by this template:
        not when the template wrote it already (two BOS tokens confuse models)."""
        return not (self.bos_token and text.startswith(self.bos_token))

    @property
    def takes_tools(self) -> bool:
        """Whether the template reads a `tools` variable: one that does not would drop the tools offered."""
        return _takes_tools(self.source)

    def render(self, messages: Sequence[Mapping[str, str]], *, add_generation_prompt: bool = True,
               tools: Sequence[Mapping] | None = None) -> str:
        """The prompt text for `messages` (dicts with "role" and "content"; an assistant's may
        have "tool_calls", a tool's "tool_call_id", as Hugging Face templates read them), offering
        `tools` (OpenAI's function definitions) to a template that takes them."""
        return self._render(messages, add_generation_prompt, tools)

    def _render(self, messages: Sequence[Mapping[str, str]], add_generation_prompt: bool,
                tools: Sequence[Mapping] | None) -> str:
        try:
            return _render(
                _compile(self.source),
                [{key: m[key] for key in TEMPLATE_KEYS if key in m} for m in messages],
                add_generation_prompt=add_generation_prompt,
                bos_token=self.bos_token,
                eos_token=self.eos_token,
                tools=tools,
            )
        except _TooCostly as e:
            raise TemplateError(
                f"The chat template of {self.model} was stopped: {e}, more than a chat prompt needs. "
                f"A template comes with the model file; choose a built-in format with --template instead "
                f"({', '.join(BUILTIN_FORMATS)})."
            ) from None
        except TemplateError as e:
            raise TemplateError(f"The chat template of {self.model} refused the conversation: {e}") from None
        except Exception as e:  # an untrusted template may fail in any way
            raise TemplateError(
                f"The chat template of {self.model} failed to render "
                f"({type(e).__name__}: {one_line(str(e), ERROR_CHARS)}). "
                f"Choose a built-in format with --template instead: {', '.join(BUILTIN_FORMATS)}."
            ) from None

    def render_placed(self, messages: Sequence[Mapping[str, str]], *, add_generation_prompt: bool = True,
                      tools: Sequence[Mapping] | None = None) -> Rendered:
        """The prompt text for `messages`, and where each message's content sits in it.

        The template is rendered a second time with each content replaced by a
        stand-in (keeping its surrounding whitespace, which templates test and
        trim). Between the stand-ins lies the template's own text. The real text
        must then read as that text with each content in its stand-in's place, as
        it is or stripped of surrounding whitespace; a content the template
        rewrote (a reasoning block cut out, say) is placed as whatever stands
        between the template's texts, with `verbatim` false. Where the real text
        does not read that way (the template's own text depends on the contents)
        nothing is placed and `aligned` is false.
        """
        text = self.render(messages, add_generation_prompt=add_generation_prompt, tools=tools)
        contents = [m["content"] if isinstance(m["content"], str) else None for m in messages]
        stand = _StandIns(contents, self.source + self.bos_token + self.eos_token)
        stand_ins = [{**m, "content": m["content"] if c is None else stand.stand_in(i, c)}
                     for i, (m, c) in enumerate(zip(messages, contents))]
        try:
            marked = self._render(stand_ins, add_generation_prompt, tools)
        except TemplateError:  # the template refused the stand-ins: its text depends on the contents
            return Rendered(text, (None,) * len(messages), aligned=False)
        placed = _align(text, stand.split(marked, contents), contents)
        if placed is None:
            return Rendered(text, (None,) * len(messages), aligned=False)
        return Rendered(text, placed, aligned=True)


@dataclass(frozen=True)
class Placed:
    """Where the template put one message's content: characters [start, end) of the text."""

    start: int
    end: int
    verbatim: bool
    """The content itself (or stripped of surrounding whitespace), not a text the template made of it."""


@dataclass(frozen=True)
class Rendered:
    """A rendered prompt text and where each message's content sits in it."""

    text: str
    placed: tuple[Placed | None, ...]
    """One per message: None where the template left the message out, its content is empty,
    or nothing could be placed."""
    aligned: bool
    """Whether the text was read as the template's own texts and the contents; when not, nothing is placed."""


class _StandIns:
    """Stand-ins for contents: the message's index between two private-use characters
    that neither a content nor the template holds, in the content's surrounding
    whitespace, which templates test and trim."""

    def __init__(self, contents: Sequence[str | None], source: str):
        taken = set(source).union(*(c for c in contents if c))
        free = (chr(c) for c in range(0xE000, 0xF900) if chr(c) not in taken)
        self.open, self.close = next(free), next(free)
        self._pattern = re.compile(re.escape(self.open) + r"(\d+)" + re.escape(self.close))

    def stand_in(self, index: int, content: str) -> str:
        """An empty content stands for itself: templates test for it, and it needs no place."""
        return _lead(content) + f"{self.open}{index}{self.close}" + _trail(content) if content else ""

    def split(self, marked: str, contents: Sequence[str | None]) -> tuple[list[str], list[int]] | None:
        """The template's own texts around the stand-ins in `marked` (one more than there
        are stand-ins), and the messages the stand-ins are of; None unless each message
        appears at most once, in order. A stand-in's whitespace counts as its own where
        the template kept it."""
        texts, indices, last = [], [], 0
        for m in self._pattern.finditer(marked):
            index, start, end = int(m.group(1)), m.start(), m.end()
            if indices and index <= indices[-1] or index >= len(contents) or contents[index] is None:
                return None
            lead, trail = _lead(contents[index]), _trail(contents[index])
            if lead and start - len(lead) >= last and marked.startswith(lead, start - len(lead)):
                start -= len(lead)
            if trail and marked.startswith(trail, end):
                end += len(trail)
            texts.append(marked[last:start])
            indices.append(index)
            last = end
        texts.append(marked[last:])
        return texts, indices


def _align(text: str, split: tuple[list[str], list[int]] | None,
           contents: Sequence[str | None]) -> tuple[Placed | None, ...] | None:
    """Read `text` as the template's own texts with the contents between them: each
    content as it is or stripped, else (rewritten by the template) whatever stands
    before the next of the template's texts. None where `text` does not read so."""
    if split is None:
        return None
    texts, indices = split
    if not text.startswith(texts[0]):
        return None
    placed: list[Placed | None] = [None] * len(contents)
    pos = len(texts[0])
    for n, (index, after) in enumerate(zip(indices, texts[1:]), start=1):
        content = contents[index]
        last = n == len(indices)
        found = next((c for c in (content, content.strip(), content.lstrip(), content.rstrip())
                      if text.startswith(c, pos) and _ends_with_at(text, after, pos + len(c), last)), None)
        if found is not None:
            placed[index] = Placed(pos, pos + len(found), verbatim=True)
        else:
            end = len(text) - len(after) if last else text.find(after, pos)
            if end < pos or not text.startswith(after, end):
                return None
            placed[index] = Placed(pos, end, verbatim=False)
        pos = placed[index].end + len(after)
    return tuple(placed) if pos == len(text) else None


def _ends_with_at(text: str, after: str, pos: int, last: bool) -> bool:
    """Whether `after` stands at `pos` in `text` (and ends it, when it is the last of the template's texts)."""
    return text.startswith(after, pos) and (not last or pos + len(after) == len(text))


def _lead(text: str) -> str:
    return text[:len(text) - len(text.lstrip())]


def _trail(text: str) -> str:
    return text[len(text.rstrip()):]


def known_template(template: str) -> str:
    """`template` when it names a built-in format or is Jinja source (it holds `{{` or
    `{%`); else TemplateError naming the built-in formats. Pure, so the command line
    checks --template with it before any model loads."""
    if template in BUILTIN_FORMATS or "{{" in template or "{%" in template:
        return template
    raise TemplateError(f"Unknown chat format {template!r}: choose one of {', '.join(BUILTIN_FORMATS)}.")


def chat_template(engine: ChatEngine, *, template: str | None = None, model: str = "the model") -> ChatTemplate:
    """The template to use with `engine`: `template` when given (a built-in
    format's name or Jinja source), else the one stored in the target GGUF.

    Raises TemplateError when there is neither, or the template does not compile.
    """
    bos = engine.token_text(engine.bos) if engine.bos is not None else ""
    eos = engine.token_text(engine.eos) if engine.eos is not None else ""
    if template in BUILTIN_FORMATS:
        source, name, stop = BUILTIN_FORMATS[template], template, BUILTIN_STOPS[template]
    elif template:
        source, name, stop = known_template(template), "custom", ()
    elif engine.chat_template:
        source, name, stop = engine.chat_template, "gguf", ()
    else:
        raise TemplateError(
            f"{model} has no chat template in its GGUF file. Choose a built-in format with "
            f"--template ({', '.join(BUILTIN_FORMATS)}); the model card says which one it was trained on."
        )
    if len(source) > TEMPLATE_CHARS:
        raise TemplateError(
            f"The chat template of {model} is {len(source):,} characters long, more than a chat template needs "
            f"(at most {TEMPLATE_CHARS:,}). Choose a built-in format with --template instead: "
            f"{', '.join(BUILTIN_FORMATS)}.")
    try:
        _compile(source)
    except jinja2.TemplateSyntaxError as e:
        raise TemplateError(f"The chat template of {model} is not valid Jinja "
                            f"(line {e.lineno}: {one_line(e.message or '', ERROR_CHARS)}).") from None
    except Exception as e:  # an untrusted template may break the compiler too (RecursionError, IndentationError)
        raise TemplateError(
            f"The chat template of {model} could not be compiled ({type(e).__name__}: {one_line(str(e), ERROR_CHARS)}). "
            f"Choose a built-in format with --template instead: {', '.join(BUILTIN_FORMATS)}."
        ) from None
    return ChatTemplate(source, name, model=model, bos_token=bos, eos_token=eos, stop=stop)


# -- the sandbox -------------------------------------------------------------------------
#
# A template from a downloaded GGUF is untrusted. The sandbox keeps it away from
# Python's internals and from changing the messages; the bounds below keep it
# from hanging the app or exhausting memory. Every render gets a budget: a
# deadline, a number of loop steps and calls, and a size no value or output may
# pass, checked before an operation that could allocate past it (`'x' * 10**10`,
# `ljust(10**9)`, `'%0999999999d'`, an indent or a tab's width) and after any other.
# A list, tuple or dict counts all it holds, as often as it holds it: written out,
# a list of one large text a thousand times is a thousand large texts.

TEMPLATE_CHARS = 256 * 1024
"""The longest template compiled: compiling is not bounded as rendering is, and takes
seconds a megabyte (5 MB of tags: 26 s on a 2-core CPU); real templates are a few
kilobytes, the largest tens."""
RENDER_SECONDS = 10.0
"""Wall-clock time one render may take (a chat turn renders a few times)."""
RENDER_STEPS = 5_000_000
"""Loop iterations, calls and attribute reads one render may make."""
RENDER_CHARS = 8_000_000
"""Characters (or items) any value or the output may hold, beyond twice the conversation's own size."""


class _TooCostly(Exception):
    """A render went past its budget."""


class _Budget(threading.local):
    deadline: float = 0.0
    steps: int = 0
    max_size: int = RENDER_CHARS
    sizes: dict | None = None
    """The size of each list, tuple and dict sized in this render, by id (with the value, which keeps the id its own)."""


_budget = _Budget()


@contextmanager
def _budgeted(messages: Sequence[Mapping[str, str]], tools):
    """The budget of one render (of `messages`, offering `tools`), for this thread."""
    saved = (_budget.deadline, _budget.steps, _budget.max_size, _budget.sizes)
    _budget.deadline = time.monotonic() + RENDER_SECONDS
    _budget.steps = RENDER_STEPS
    sent = sum(len(m["content"]) + _size(m.get("tool_calls")) for m in messages) + _size(tools)
    _budget.max_size = RENDER_CHARS + 2 * sent
    _budget.sizes = {}
    try:
        yield
    finally:
        _budget.deadline, _budget.steps, _budget.max_size, _budget.sizes = saved


def _step() -> None:
    _budget.steps -= 1
    if _budget.steps < 0:
        raise _TooCostly(f"it took more than {RENDER_STEPS:,} steps")
    if _budget.steps % 1024 == 0 and time.monotonic() > _budget.deadline:
        raise _TooCostly(f"it ran for more than {RENDER_SECONDS:g} s")


_HOLDERS = (str, bytes, list, tuple, dict)


def _size(value) -> int:
    """The characters and items `value` holds, a list, tuple or dict counting all it holds
    as often as it holds it: a list of one text a thousand times is a thousand texts once
    written out. Counting stops past the budget; a list, tuple or dict of a thousand or
    more is counted once per render."""
    if isinstance(value, (str, bytes)):
        return len(value)
    if not isinstance(value, _HOLDERS):
        return 0
    sizes = _budget.sizes if _budget.sizes is not None else {}
    known = sizes.get(id(value))
    if known is not None and known[0] is value:
        return known[1]
    items = (*value.keys(), *value.values()) if isinstance(value, dict) else value
    size, limit = len(items), _budget.max_size
    for item in items:
        if size > limit:
            break
        if isinstance(item, str):  # the common case, without a call
            size += len(item)
        elif item and isinstance(item, _HOLDERS):
            size += _size(item)
    if size >= 1024:  # small ones are counted again as cheaply as they are looked up
        sizes[id(value)] = (value, size)
    return size


def _sized(value):
    """`value`, unless it holds more than a render may."""
    if isinstance(value, _HOLDERS) and _size(value) > _budget.max_size:
        raise _TooCostly(f"it built a value of more than {_budget.max_size:,} characters or items")
    return value


def _check_size(n: int) -> None:
    if n > _budget.max_size:
        raise _TooCostly(f"it asked for {n:,} characters or items")


def _consumed(value):
    """`value`, or where what it holds is known only once it is consumed (a generator,
    a range, a dict's keys) the list of its items, each a step and the list sized as it
    grows: a filter or a call is given what the budget can check before it runs."""
    if not isinstance(value, (Iterator, range, MappingView)) or isinstance(value, LoopContext):
        return value
    items, size = [], 0
    for item in value:
        _step()
        size += 1 + _size(item)
        _check_size(size)
        items.append(item)
    return items


def _check_args(args, kwargs) -> None:
    """Refuse, before the call, arguments that make a result too large to hold."""
    for a in (*args, *kwargs.values()):
        if isinstance(a, int) and not isinstance(a, bool) and abs(a) > _budget.max_size:
            _check_size(abs(a))  # a width, a count, a repeat: ljust(10**9), indent(10**9), range(10**9)


_PRINTF_FIELD = re.compile(r"%(?:\([^)]*\))?[#0 +-]*(\*|\d+)?(?:\.(\*|\d+))?")
"""A printf-style field up to its width and precision, each a number or `*`."""


def _printf_size(text: str, values) -> int:
    """At most how long `text % values` is: the text, each field's width and precision,
    and the values (an int may be a `*` width; a float is at most a few hundred digits)."""
    values = values if isinstance(values, tuple) else (values,)
    widths = sum(int(n) for m in _PRINTF_FIELD.finditer(text) for n in m.groups() if n and n != "*")
    shown = sum(abs(v) if isinstance(v, int) else 400 if isinstance(v, float) else _size(v) for v in values)
    return len(text) + widths + shown


def _check_call(obj, args, kwargs) -> None:
    """Size checks for the calls whose result can be far larger than their arguments."""
    self = getattr(obj, "__self__", None)
    name = getattr(obj, "__name__", "")
    if not isinstance(self, str):
        return
    if name == "replace" and len(args) >= 2:
        old, new = str(args[0]), str(args[1])
        count = self.count(old) if old else len(self) + 1
        _check_size(len(self) + count * max(len(new) - len(old), 0))
    elif name == "join" and args:
        _check_size(_joined_size(self, args[0]))
    elif name == "expandtabs":
        tab = args[0] if args else kwargs.get("tabsize", 8)
        if isinstance(tab, int):
            _check_size(len(self) + self.count("\t") * tab)
    elif name == "translate" and args and isinstance(args[0], dict):
        longest = max((_size(v) for v in args[0].values()), default=1)
        _check_size(len(self) * max(longest, 1))


def _joined_size(separator, items) -> int:
    """The length of `separator` joining `items` (texts; others count as short), reckoned
    before it is built: an empty separator joins long items as surely as a long one joins many."""
    if not isinstance(items, (list, tuple, str)):
        return 0
    texts = sum(len(x) if isinstance(x, str) else 8 for x in items)
    return texts + len(str(separator)) * max(len(items) - 1, 0)


def _check_filter(name: str, args, kwargs) -> None:
    """Size checks, before the call, for the filters whose result can be far larger than
    their arguments (join, replace, indent); args as the filter gets them."""
    values = [a for a in args if not isinstance(a, (EvalContext, Context, Environment))]  # a filter's context
    if name == "do_join" and values:
        _check_size(_joined_size(kwargs.get("d", values[1] if len(values) > 1 else ""), values[0]))
    elif name == "do_replace" and len(values) >= 3 and isinstance(values[0], str):
        text, old, new = values[0], str(values[1]), str(values[2])
        count = text.count(old) if old else len(text) + 1
        _check_size(len(text) + count * max(len(new) - len(old), 0))
    elif name == "do_indent" and values and isinstance(values[0], str):
        width = kwargs.get("width", values[1] if len(values) > 1 else 4)
        prefix = len(width) if isinstance(width, str) else abs(width) if isinstance(width, int) else 0
        _check_size(len(values[0]) + prefix * (values[0].count("\n") + 1))
    elif name == "do_wordwrap" and values and isinstance(values[0], str):
        text, width = values[0], kwargs.get("width", values[1] if len(values) > 1 else 79)
        wrap = kwargs.get("wrapstring", values[3] if len(values) > 3 else None)
        if isinstance(wrap, str) and isinstance(width, int):  # a line per width, and at most one per space
            lines = len(text) // max(width, 1) + text.count(" ") + text.count("\n") + 1
            _check_size(len(text) + lines * len(wrap))
    elif name == "do_format" and values and isinstance(values[0], str):
        _check_size(_printf_size(values[0], kwargs or tuple(values[1:])))


class _BoundedEnvironment(ImmutableSandboxedEnvironment):
    """The immutable sandbox, with every render held to its _Budget."""

    intercepted_binops = frozenset({"*", "**", "+", "%"})

    def call_binop(self, context, operator, left, right):
        _step()
        numbers = (int, float)
        if operator == "*":
            for seq, n in ((left, right), (right, left)):
                if isinstance(seq, (str, list, tuple)) and isinstance(n, int):
                    _check_size(_size(seq) * n)
        elif operator == "**" and isinstance(left, numbers) and isinstance(right, numbers):
            if abs(left) > 1 and right > 64 and right * math.log2(abs(left)) > 4096:
                raise _TooCostly(f"it asked for {left} ** {right}")
        elif operator == "+" and isinstance(left, (str, list, tuple)) and isinstance(right, (str, list, tuple)):
            _check_size(_size(left) + _size(right))
        elif operator == "%" and isinstance(left, str):
            _check_size(_printf_size(left, right))
        return _sized(super().call_binop(context, operator, left, right))

    def call(__self, __context, __obj, *args, **kwargs):  # noqa: N805 (Jinja's signature)
        _step()
        if isinstance(__obj, LoopContext) and args:  # a recursive loop's loop(items): each item is a step too
            args = (_bounded_iter(args[0]), *args[1:])
        else:
            args, kwargs = tuple(map(_consumed, args)), {k: _consumed(v) for k, v in kwargs.items()}
        _check_args(args, kwargs)
        _check_call(__obj, args, kwargs)
        return _sized(super().call(__context, __obj, *args, **kwargs))

    def getattr(self, obj, attribute):
        _step()
        return _sized(super().getattr(obj, attribute))

    def getitem(self, obj, argument):
        _step()
        return _sized(super().getitem(obj, argument))

    def wrap_str_format(self, value):
        """A text's format and format_map, with each field held to the budget."""
        if super().wrap_str_format(value) is None:
            return None
        text, formatter = value.__self__, _BoundedFormatter(self)
        if value.__name__ == "format_map":
            return lambda mapping: formatter.vformat(text, (), mapping)
        return lambda *args, **kwargs: formatter.vformat(text, args, kwargs)


class _BoundedFormatter(SandboxedFormatter):
    """str.format in the sandbox, each field checked before it is written (its width and
    precision, whether given in the text or by an argument) and the text so far after."""

    def vformat(self, format_string, args, kwargs):
        self._written = len(format_string)
        return super().vformat(format_string, args, kwargs)

    def format_field(self, value, format_spec):
        _step()
        _check_size(self._written + sum(int(n) for n in re.findall(r"\d+", format_spec)) + _size(value))
        text = super().format_field(value, format_spec)
        self._written += len(text)
        _check_size(self._written)
        return text


def _bounded_filter(f):
    """A filter held to the budget like a call (filters do not go through Environment.call)."""
    @functools.wraps(f)
    def bounded(*args, **kwargs):
        _step()
        args, kwargs = tuple(map(_consumed, args)), {k: _consumed(v) for k, v in kwargs.items()}
        _check_args(args[1:], kwargs)  # args[0]: the value filtered (or the context)
        _check_filter(f.__name__, args, kwargs)
        return _sized(f(*args, **kwargs))
    return bounded


def _bounded_iter(iterable):
    """What a template's for loop iterates: one step of the budget per item."""
    for item in iterable:
        _step()
        yield item


def _bounded_concat(parts) -> str:
    """The `~` operator, refusing a result larger than a render may hold."""
    _check_size(sum(map(_size, parts)))
    texts = [str(p) for p in parts]
    _check_size(sum(map(len, texts)))
    return "".join(texts)


def _within_budget(pieces) -> str:
    """The text of `pieces`, checked as it grows."""
    out, size = [], 0
    for piece in pieces:
        size += len(piece)
        _check_size(size)
        out.append(piece)
    return "".join(out)


class _Bound(NodeTransformer):
    """Routes the operations the sandbox does not intercept through the budget: for
    loops (each item is a step), `~` (its result is sized) and the lists, tuples and
    dicts a template writes (sized with all they hold, like a call's result)."""

    def visit_List(self, node: nodes.List) -> nodes.Call:
        return self._sized(self.generic_visit(node))

    def visit_Dict(self, node: nodes.Dict) -> nodes.Call:
        return self._sized(self.generic_visit(node))

    def visit_Tuple(self, node: nodes.Tuple) -> nodes.Expr:
        node = self.generic_visit(node)
        return self._sized(node) if node.ctx == "load" else node  # not a target: `for a, b in ...`

    @staticmethod
    def _sized(node: nodes.Expr) -> nodes.Call:
        return nodes.Call(nodes.Name("_es_sized", "load"), [node], [], None, None, lineno=node.lineno)

    def visit_For(self, node: nodes.For) -> nodes.For:
        node = self.generic_visit(node)
        node.iter = nodes.Call(nodes.Name("_es_bounded_iter", "load"), [node.iter], [], None, None,
                               lineno=node.lineno)
        return node

    def visit_Concat(self, node: nodes.Concat) -> nodes.Call:
        node = self.generic_visit(node)
        return nodes.Call(nodes.Name("_es_bounded_concat", "load"), [nodes.List(node.nodes, lineno=node.lineno)],
                          [], None, None, lineno=node.lineno)


ERROR_CHARS = 300
"""The most of a template's own words (raise_exception's message, an error it caused) an error shows."""


def _raise_exception(message: str):
    raise TemplateError(one_line(str(message), ERROR_CHARS))  # the model file's words: one line, no escapes


def _tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    """json.dumps, checked as it is written: an indent is repeated on every line."""
    encoder = json.JSONEncoder(ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)
    return _within_budget(encoder.iterencode(value))


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


_ENV = _BoundedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
_ENV.filters["tojson"] = _tojson
_ENV.filters = {name: _bounded_filter(f) for name, f in _ENV.filters.items()}
_ENV.globals["raise_exception"] = _raise_exception
_ENV.globals["strftime_now"] = _strftime_now
_ENV.globals["_es_bounded_iter"] = _bounded_iter
_ENV.globals["_es_bounded_concat"] = _bounded_concat
_ENV.globals["_es_sized"] = _sized
del _ENV.globals["lipsum"]  # no chat template writes lorem ipsum, and one call may write gigabytes of it
_COMPILED: dict[str, jinja2.Template] = {}


def _compile(source: str) -> jinja2.Template:
    if source not in _COMPILED:
        tree = _Bound().visit(_ENV.parse(source))
        tree.set_environment(_ENV)
        _COMPILED[source] = _ENV.from_string(tree)
    return _COMPILED[source]


def _render(template: jinja2.Template, messages, *, tools, **context) -> str:
    """Render within the budget; the output is checked as it grows."""
    with _budgeted(messages, tools):
        return _within_budget(template.generate(messages=messages, tools=tools, **context))


@functools.lru_cache(maxsize=8)
def _takes_tools(source: str) -> bool:
    return "tools" in jinja2.meta.find_undeclared_variables(_ENV.parse(source))

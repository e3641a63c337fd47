"""Chat templates: turn a conversation into the prompt text a model was trained on.

A GGUF carries its template as Jinja source (`tokenizer.chat_template`). It
comes from a downloaded file, so it is untrusted: it is rendered in Jinja's
sandbox, with the same helpers Hugging Face transformers gives templates
(`raise_exception`, `strftime_now`, a `tojson` filter that keeps non-ASCII).
A model without a template gets one of the built-in formats, but only when
the user names it: a guessed format would be silently wrong.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Mapping, Sequence

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

from edgespec.errors import TemplateError

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

    def render(self, messages: Sequence[Mapping[str, str]], *, add_generation_prompt: bool = True) -> str:
        """The prompt text for `messages` (dicts with "role" and "content")."""
        try:
            return _compile(self.source).render(
                messages=[{"role": m["role"], "content": m["content"]} for m in messages],
                add_generation_prompt=add_generation_prompt,
                bos_token=self.bos_token,
                eos_token=self.eos_token,
            )
        except TemplateError as e:
            raise TemplateError(f"The chat template of {self.model} refused the conversation: {e}") from None
        except Exception as e:  # an untrusted template may fail in any way
            raise TemplateError(
                f"The chat template of {self.model} failed to render ({type(e).__name__}: {e}). "
                f"Choose a built-in format instead: {', '.join(BUILTIN_FORMATS)}."
            ) from None


def chat_template(engine, *, template: str | None = None, model: str = "the model") -> ChatTemplate:
    """The template to use with `engine`: `template` when given (a built-in
    format's name or Jinja source), else the one stored in the target GGUF.

    Raises TemplateError when there is neither, or the template does not compile.
    """
    bos = engine.token_text(engine.bos) if engine.bos is not None else ""
    eos = engine.token_text(engine.eos) if engine.eos is not None else ""
    if template in BUILTIN_FORMATS:
        source, name, stop = BUILTIN_FORMATS[template], template, BUILTIN_STOPS[template]
    elif template and ("{{" in template or "{%" in template):
        source, name, stop = template, "custom", ()
    elif template:
        raise TemplateError(f"Unknown chat format {template!r}: choose one of {', '.join(BUILTIN_FORMATS)}.")
    elif engine.chat_template:
        source, name, stop = engine.chat_template, "gguf", ()
    else:
        raise TemplateError(
            f"{model} has no chat template in its GGUF file. Choose a built-in format with "
            f"--template ({', '.join(BUILTIN_FORMATS)}); the model card says which one it was trained on."
        )
    try:
        _compile(source)
    except jinja2.TemplateSyntaxError as e:
        raise TemplateError(f"The chat template of {model} is not valid Jinja (line {e.lineno}: {e.message}).") from None
    return ChatTemplate(source, name, model=model, bos_token=bos, eos_token=eos, stop=stop)


# -- the sandbox -------------------------------------------------------------------------

def _raise_exception(message: str):
    raise TemplateError(message)


def _tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


_ENV = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
_ENV.filters["tojson"] = _tojson
_ENV.globals["raise_exception"] = _raise_exception
_ENV.globals["strftime_now"] = _strftime_now
_COMPILED: dict[str, jinja2.Template] = {}


def _compile(source: str) -> jinja2.Template:
    if source not in _COMPILED:
        _COMPILED[source] = _ENV.from_string(source)
    return _COMPILED[source]

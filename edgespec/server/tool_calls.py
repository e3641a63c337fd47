"""Tool calls in a reply's text, as Hermes-style models write them (Qwen2.5 and many others):

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

one block per call. A reply that is nothing but one call's JSON, bare or in a json
fence, is a call too where its name is one of the tools offered: Qwen2.5-Coder answers
a tool offer that way (llama-server's Hermes parser reads it so as well), and so do
Llama 3.1-3.3, naming the arguments "parameters". So is a reply that is nothing but a
JSON list of offered calls: Mistral's, after its [TOOL_CALLS] control token (not text).
`split_calls` reads a whole reply; `CallStream` reads one as it is streamed, holding
back only text that is, or may become, a call, and both give the same text and calls
however the reply is cut. Whitespace next to a call is the layout between calls, not
text of the reply: it is dropped. A block that is not a call (its body not a JSON
object with a string "name") stays text, as it was written.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

OPEN, CLOSE = "<tool_call>", "</tool_call>"


@dataclass(frozen=True)
class Call:
    """One call: the function's name and its arguments as a JSON text (OpenAI's shape)."""

    name: str
    arguments: str


def template_arguments(arguments: str):
    """A call's arguments (a JSON text) as a chat template writes them: the JSON value,
    which templates render with `tojson`, or the text itself where it is not JSON."""
    try:
        return json.loads(arguments)
    except (ValueError, RecursionError):
        return arguments


def split_calls(text: str, names: frozenset[str] = frozenset()) -> tuple[str, list[Call]]:
    """The text of a whole reply outside its calls, and the calls, in order (`names`:
    the tools offered, which a reply of one call's JSON alone may call)."""
    stream = CallStream(names)
    pieces = stream.feed(text) + stream.finish()
    return "".join(p for p in pieces if isinstance(p, str)), [p for p in pieces if isinstance(p, Call)]


class CallStream:
    """A streamed reply's text, fed as it comes, given back as text and calls in order."""

    def __init__(self, names: frozenset[str] = frozenset()) -> None:
        self.names = names
        """The tools offered: a reply of one call's JSON alone calls one of them."""
        self.calls = 0
        """The calls given back so far."""
        self._alone = bool(names)
        """Whether the reply may yet be one call's JSON alone (held back whole until it ends)."""
        self._held = ""
        """Outside a call: text not given back yet (trailing whitespace, and what may begin OPEN)."""
        self._body: str | None = None
        """Inside a call: what follows its OPEN so far; None outside one."""
        self._lead = ""
        """The whitespace before the open call's OPEN, given back if the block is not a call."""
        self._after_call = False
        """Whether the last thing given back was a call (the whitespace that follows it is dropped)."""

    def feed(self, text: str) -> list[str | Call]:
        """What of the reply so far, with `text`, is known: texts and calls, in order."""
        out: list[str | Call] = []
        if self._body is None:
            self._held += text
        else:
            self._body += text
        while True:
            if self._body is None:
                if not self._outside(out):
                    return out
            else:
                end = self._body.find(CLOSE)
                if end < 0:
                    return out
                rest = self._body[end + len(CLOSE):]
                self._close(self._body[:end], CLOSE, out)
                self._held = rest

    def finish(self) -> list[str | Call]:
        """The rest, once the reply has ended: a last call may lack its CLOSE."""
        if self._alone:
            calls = _alone(self._held, self.names)
            if calls:
                self._held, self.calls = "", self.calls + len(calls)
                return list(calls)
            self._alone = False
            out = self.feed("")
            return out + self.finish()
        out: list[str | Call] = []
        if self._body is not None:
            self._close(self._body, "", out)
        elif self._held:
            out.append(self._held)
        self._held = ""
        return out

    def _outside(self, out: list) -> bool:
        """Give back the held text up to a call's OPEN and enter the call (True), or up
        to what may begin one, holding that back (False)."""
        if self._alone:
            self._alone = _may_be_alone(self._held.lstrip())
            if self._alone:
                return False
        if self._after_call:
            stripped = self._held.lstrip()
            if not stripped:
                self._held = ""
                return False
            self._held, self._after_call = stripped, False
        start = self._held.find(OPEN)
        if start < 0:
            keep = _undecided(self._held)
            if len(self._held) > keep:
                out.append(self._held[:len(self._held) - keep])
                self._held = self._held[len(self._held) - keep:]
            return False
        before = self._held[:start]
        text = before.rstrip()
        if text:
            out.append(text)
        self._lead, self._body, self._held = before[len(text):], self._held[start + len(OPEN):], ""
        return True

    def _close(self, body: str, close: str, out: list) -> None:
        call = _call(body)
        if call is None:
            out.append(self._lead + OPEN + body + close)
        else:
            out.append(call)
            self.calls += 1
        self._after_call = call is not None
        self._body, self._lead = None, ""


def _undecided(text: str) -> int:
    """How many characters at the end of `text` may yet turn out to lie next to a call:
    a start of OPEN, and the whitespace before it."""
    partial = next((n for n in range(len(OPEN) - 1, 0, -1) if text.endswith(OPEN[:n])), 0)
    rest = text[:len(text) - partial]
    return partial + len(rest) - len(rest.rstrip())


FENCE = "```"


def _may_be_alone(text: str) -> bool:
    """Whether a reply that begins with `text` (its leading whitespace gone) may be
    calls' JSON alone: it begins a JSON object or a list of them, or a fence of no
    language or json."""
    if not text or text.startswith("{") or FENCE.startswith(text):
        return True
    if text.startswith("["):
        rest = text[1:].lstrip()
        return not rest or rest.startswith("{")
    if not text.startswith(FENCE):
        return False
    language, newline, _ = text[len(FENCE):].partition("\n")
    return language.strip().lower() in ("", "json") if newline else "json".startswith(language.lower())


def _alone(text: str, names: frozenset[str]) -> list[Call] | None:
    """The calls that `text`, a whole reply, is alone (one call's JSON or a list of
    calls, bare or in a fence), where each calls one of `names`."""
    body = text.strip()
    if body.startswith(FENCE):
        if not body.endswith(FENCE) or len(body) < 2 * len(FENCE):
            return None
        body = body[len(FENCE):-len(FENCE)].partition("\n")[2]
    value = _json(body)
    calls = [_call_of(v) for v in (value if isinstance(value, list) else [value])]
    return calls if calls and all(c is not None and c.name in names for c in calls) else None


def _call(body: str) -> Call | None:
    """The call a block's body writes, or None where it is not one."""
    return _call_of(_json(body))


def _json(text: str):
    """The JSON value `text` writes (None where it writes none)."""
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return None


def _call_of(value) -> Call | None:
    """The call a JSON value is: an object with a name and its arguments ("arguments",
    or Llama 3.x's "parameters"; none: empty ones), or None."""
    if not isinstance(value, dict) or not isinstance(value.get("name"), str) or not value["name"]:
        return None
    arguments = value.get("arguments", value.get("parameters", {}))
    return Call(value["name"], arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False))

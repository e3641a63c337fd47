"""Request and response bodies, mirroring the OpenAI API's shapes.

Requests are validated strictly (a string where a number belongs is an error,
not a guess). Fields this server does not implement are declared so that a
client that uses them gets a clear 400 rather than a silently different
answer; fields OpenAI does not define are ignored, as llama-server does, so
that clients sending their own extras keep working.
"""

from __future__ import annotations

import json
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr, field_validator, model_validator

from edgespec.engine.events import MODES
from edgespec.limits import LIMITS

Number = Annotated[float, Field(strict=True, allow_inf_nan=False)]
"""A finite JSON number (an integer is a number too; a string is not, nor Python's NaN or Infinity)."""


def _limited(name: str):
    """An optional field within the range of edgespec/limits.py (None: the server's default)."""
    limit = LIMITS[name]
    bounds = {("gt" if limit.above_low else "ge"): limit.low, "le": limit.high}
    return Field(None, description=limit.help, **{key: value for key, value in bounds.items() if value is not None})


def _unicode(text: str) -> str:
    """JSON may escape half of a UTF-16 surrogate pair alone ("\\ud800"): no character, and no UTF-8."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(f"the text holds a lone UTF-16 surrogate (\\u{ord(text[e.start]):04x}) at character "
                         f"{e.start}, which is not a character: send valid Unicode text") from None
    return text


Text = Annotated[StrictStr, AfterValidator(_unicode)]
"""A JSON string that is valid Unicode text."""


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)


def _unsupported(what: str, why: str = "this server does not implement it") -> ValueError:
    return ValueError(f"{what} is not supported: {why}")


# -- requests ----------------------------------------------------------------------------------

def _default_if_null(cls, value, info):
    """OpenAI's schema lets every optional field be null: null is the field's default."""
    return cls.model_fields[info.field_name].get_default() if value is None else value


class StreamOptions(_Body):
    include_usage: StrictBool = False

    _null = field_validator("include_usage", mode="before")(classmethod(_default_if_null))


class Speculation(_Body):
    """edgespec's extension: how to speculate for this request (default: the server's settings)."""

    mode: Literal[MODES] | None = None  # type: ignore[valid-type]
    k: StrictInt | None = _limited("k")


class ContentPart(_Body):
    type: StrictStr
    text: Text | None = None

    @model_validator(mode="after")
    def _text_only(self):
        if self.type != "text":
            raise _unsupported(f"content of type {self.type!r}", "the models served are text-only")
        if self.text is None:
            raise ValueError("a content part of type 'text' needs its 'text'")
        return self


class FunctionCall(_Body):
    name: Text
    arguments: Text
    """The arguments as a JSON text, as OpenAI sends and expects them."""


class ToolCall(_Body):
    """A call an assistant made: in a message sent back, and in a reply."""

    id: Text
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(_Body):
    role: StrictStr
    content: Text | list[ContentPart] | None = Field(None, validate_default=True)
    name: StrictStr | None = None
    tool_calls: list[ToolCall] | None = None
    """An assistant's calls (its content may then be null)."""
    tool_call_id: Text | None = None
    """A tool message's: the call it answers."""

    @field_validator("content")
    @classmethod
    def _has_content(cls, content, info):
        # As OpenAI's API: only an assistant message (one that called tools) may have none.
        if content in (None, []) and info.data.get("role", "assistant") != "assistant":
            raise ValueError(f"a {info.data['role']} message needs content (a text, or a list of text parts)")
        return content

    @field_validator("role")
    @classmethod
    def _known_role(cls, role: str) -> str:
        if role == "function":
            raise _unsupported("a message with role 'function'",
                               "send a call's result as a message with role 'tool' and its 'tool_call_id'")
        if role not in ("system", "developer", "user", "assistant", "tool"):
            raise ValueError(f"unknown role {role!r}: use system, user, assistant or tool")
        return role

    def text(self) -> str:
        """The message's text; text parts each on lines of their own (as llama-server joins them)."""
        if isinstance(self.content, list):
            return "\n".join(part.text or "" for part in self.content)
        return self.content or ""


class _Generation(_Body):
    """What chat and text completions share."""

    model: Text | None = None
    """None: the model loaded (there is only one)."""
    max_tokens: StrictInt | None = _limited("max_tokens")
    temperature: Number | None = _limited("temperature")
    top_p: Number | None = _limited("top_p")
    top_k: StrictInt | None = _limited("top_k")
    """llama-server's extension (0: off)."""
    stop: Text | list[Text] | None = None
    seed: StrictInt | None = _limited("seed")
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    n: StrictInt = 1
    presence_penalty: Number = 0.0
    frequency_penalty: Number = 0.0
    logit_bias: dict[str, Number] | None = None
    user: StrictStr | None = None
    speculation: Speculation | None = None

    _null = field_validator("stream", "n", "presence_penalty", "frequency_penalty", mode="before")(
        classmethod(_default_if_null))

    @field_validator("n")
    @classmethod
    def _one_choice(cls, n: int) -> int:
        if n != 1:
            raise _unsupported(f"n={n}", "one choice per request (send several requests instead)")
        return n

    @field_validator("presence_penalty", "frequency_penalty")
    @classmethod
    def _no_penalty(cls, value: float, info) -> float:
        if value != 0:
            raise _unsupported(f"'{info.field_name}'", "sampling here is temperature, top-k and top-p only")
        return value

    @field_validator("logit_bias")
    @classmethod
    def _no_bias(cls, value):
        if value:
            raise _unsupported("'logit_bias'")
        return value

    def stops(self) -> tuple[str, ...]:
        stop = [self.stop] if isinstance(self.stop, str) else (self.stop or [])
        return tuple(s for s in stop if s)


def _tool(index: int, tool) -> None:
    """Raises ValueError unless `tool` is a function as OpenAI defines one."""
    function = tool.get("function")
    if tool.get("type") != "function" or not isinstance(function, dict):
        raise ValueError(f"tool {index} is not a function: send {{'type': 'function', 'function': {{'name': ...}}}}")
    if not isinstance(function.get("name"), str) or not function["name"]:
        raise ValueError(f"tool {index}'s function needs a 'name' (a non-empty text)")
    if not isinstance(function.get("description", ""), str) or not isinstance(function.get("parameters", {}), dict):
        raise ValueError(f"tool {index}'s function needs its 'description' as a text and its 'parameters' "
                         f"as a JSON schema object")


class ChatCompletionRequest(_Generation):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: StrictInt | None = _limited("max_tokens")
    logprobs: StrictBool | None = None
    top_logprobs: StrictInt | None = None
    tool_choice: StrictStr | dict | None = None
    function_call: StrictStr | dict | None = None
    tools: list[dict] | None = None  # after their choices, which their validators read
    functions: list[dict] | None = None
    response_format: dict | None = None

    # Each refusal is a field's own validator, so that the error's `param` names the field.
    @field_validator("logprobs", "top_logprobs")
    @classmethod
    def _no_logprobs(cls, value, info):
        if value:
            raise _unsupported(f"'{info.field_name}'")
        return value

    @field_validator("tools")
    @classmethod
    def _functions_only(cls, tools):
        for index, tool in enumerate(tools or ()):
            _tool(index, tool)
        _unicode(json.dumps(tools, ensure_ascii=False))
        return tools

    @field_validator("tool_choice")
    @classmethod
    def _model_chooses(cls, value):
        if isinstance(value, dict) or value == "required":
            raise _unsupported(f"tool_choice {value!r}", "this server cannot force a call: the model chooses "
                                                         "whether to call a tool (send 'auto', or leave it out)")
        if value not in (None, "auto", "none"):
            raise ValueError(f"unknown tool_choice {value!r}: use 'auto' or 'none'")
        return value

    # OpenAI's older names for tools and tool_choice. With the choice "none" the model calls
    # no tool and writes a message (OpenAI's rule): the functions are then accepted, and not rendered.
    @field_validator("function_call")
    @classmethod
    def _older_choice(cls, value):
        if value not in (None, "none"):
            raise _unsupported("'function_call'", "send 'tools' and 'tool_choice' instead (OpenAI's newer names)")
        return value

    @field_validator("functions")
    @classmethod
    def _older_tools(cls, value, info):
        if value and info.data.get("function_call") != "none":
            raise _unsupported("'functions'", "send them as 'tools' (OpenAI's newer name)")
        return value

    @field_validator("response_format")
    @classmethod
    def _text_only(cls, value):
        if value and value.get("type", "text") != "text":
            raise _unsupported(f"response_format {value.get('type')!r}",
                               "replies are free text (no JSON mode or schema)")
        return value

    def reply_limit(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    def callable_tools(self) -> list[dict] | None:
        """The tools the model may call: those offered, unless tool_choice is "none"."""
        return self.tools if self.tools and self.tool_choice != "none" else None


class CompletionRequest(_Generation):
    suffix: Text | None = None
    """The text after the gap the reply fills (an editor's text after the cursor), for a
    model with fill-in-the-middle tokens; empty: none. Declared before `prompt`, whose
    checks read it."""
    prompt: Text | list[StrictInt]
    """A text, or token ids; sent as a list of one of them (a batch of one), that one."""
    echo: StrictBool = False
    logprobs: StrictInt | None = None
    best_of: StrictInt | None = None

    _null_echo = field_validator("echo", mode="before")(classmethod(_default_if_null))

    @field_validator("prompt", mode="before")
    @classmethod
    def _one_prompt(cls, prompt):
        # OpenAI's API also takes a list of prompts, texts or lists of token ids.
        if isinstance(prompt, list) and any(isinstance(p, (str, list)) for p in prompt):
            if len(prompt) != 1:
                raise _unsupported(f"{len(prompt)} prompts", "one prompt per request")
            prompt = prompt[0]
        return prompt

    @field_validator("prompt")
    @classmethod
    def _not_empty(cls, prompt, info):
        if not prompt and not info.data.get("suffix"):  # with a suffix, the gap may be at the very start
            raise ValueError("the prompt is empty")
        return prompt

    @field_validator("prompt")
    @classmethod
    def _suffix_needs_text(cls, prompt, info):
        if info.data.get("suffix") and isinstance(prompt, list):
            raise _unsupported("'suffix' with a prompt of token ids", "send the prompt as text")
        return prompt

    # Each refusal is a field's own validator, so that the error's `param` names the field.
    @field_validator("echo", "logprobs")
    @classmethod
    def _not_implemented(cls, value, info):
        if value:
            raise _unsupported(f"'{info.field_name}'")
        return value

    @field_validator("best_of")
    @classmethod
    def _one_of_one(cls, value):
        if value not in (None, 1):
            raise _unsupported(f"best_of={value}", "one choice per request")
        return value

    def reply_limit(self) -> int | None:
        return self.max_tokens


# -- responses ---------------------------------------------------------------------------------

def _omitted_when_none(default=None):
    """A field left out of the JSON while it is None (as OpenAI leaves out a chunk's usage)."""
    return Field(default, exclude_if=lambda value: value is None)


class PromptTokensDetails(BaseModel):
    cached_tokens: int
    """Prompt tokens that came from the KV cache, not read again (Timings.cache_n)."""


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails


class Timings(BaseModel):
    """What speculation did for one reply. The first names are llama-server's
    (`timings`), so that clients that read those read these too."""

    prompt_n: int
    """Prompt tokens evaluated; the rest (cache_n) came from the KV cache."""
    cache_n: int
    cache_from: str
    """Where the cache_n tokens came from: "sequence" (held in the KV cache), "ram"
    or "disk" (a snapshot of the conversation, restored), or "" (none)."""
    predicted_n: int
    predicted_ms: float
    predicted_per_second: float
    draft_n: int
    draft_n_accepted: int
    accepted_by: dict[str, int] = {}
    """draft_n_accepted per source (Stats.accepted_by): "draft", "lookup/<region label>", ..."""
    ttft_ms: float | None
    mode: str
    drafter: str
    """Drafter of the last cycle: "none", "draft" or "lookup"."""
    k: int
    acceptance_rate: float
    tokens_per_pass: float
    target_passes: int


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None
    """None where the reply is tool calls alone."""
    tool_calls: list[ToolCall] | None = _omitted_when_none()


class ToolCallDelta(ToolCall):
    """A call in a stream, sent whole once it is known."""

    index: int


class ChatChoice(BaseModel):
    index: int = 0
    message: AssistantMessage
    finish_reason: str | None
    logprobs: None = None


class _Reply(BaseModel):
    """What every completion object of OpenAI's starts with."""

    id: str
    object: str
    created: int
    model: str


class ChatCompletion(_Reply):
    object: Literal["chat.completion"] = "chat.completion"
    choices: list[ChatChoice]
    usage: Usage
    timings: Timings


class ChatDelta(BaseModel):
    role: Literal["assistant"] | None = _omitted_when_none()
    content: str | None = _omitted_when_none()
    tool_calls: list[ToolCallDelta] | None = _omitted_when_none()


class _Choice(BaseModel):
    index: int = 0
    finish_reason: str | None = None
    logprobs: None = None


class _Streamed(_Reply):
    """A reply that may be a chunk: usage and timings only in the chunks that carry them."""

    usage: Usage | None = _omitted_when_none()
    timings: Timings | None = _omitted_when_none()


class ChatChunkChoice(_Choice):
    delta: ChatDelta


class ChatCompletionChunk(_Streamed):
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    choices: list[ChatChunkChoice]


class TextChoice(_Choice):
    text: str


class Completion(_Streamed):
    object: Literal["text_completion"] = "text_completion"
    choices: list[TextChoice]


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "edgespec"
    meta: dict = Field(default_factory=dict)
    """The files served and how (edgespec's extension, as llama-server's `meta`)."""


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    error: ErrorDetail


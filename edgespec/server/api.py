"""The HTTP face: an OpenAI-compatible API over one engine.

`create_app` builds a FastAPI app from a function that loads the engine and
the server's settings. Request and response bodies are the typed models in
schemas.py; replies stream as server-sent events; every use of the engine
goes through the one EngineThread, so requests are served one at a time in
arrival order. The engine below does not know it is being served.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import hashlib
import hmac
import json
import time
import uuid
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Callable, ClassVar

import anyio
from fastapi import FastAPI, Request
from fastapi.middleware.cors import CORSMiddleware
from fastapi.openapi.utils import get_openapi
from fastapi.routing import APIRoute
from fastapi.utils import generate_unique_id
from starlette.background import BackgroundTask
from sse_starlette import EventSourceResponse

from edgespec import __version__
from edgespec.engine.events import GenerationParams, Stats
from edgespec.limits import SERVER_MAX_TOKENS
from edgespec.modes import reply_decoding
from edgespec.errors import WorkerLostError
from edgespec.server.completion import Completer, Delta, Done
from edgespec.server.error_replies import ApiError, api_error, install_handlers
from edgespec.server.schemas import (AssistantMessage, ChatChoice, ChatChunkChoice, ChatCompletion,
                                     ChatCompletionChunk, ChatCompletionRequest, ChatDelta, ChatMessage,
                                     Completion, CompletionRequest, ErrorResponse, FunctionCall, ModelCard,
                                     ModelList, PromptTokensDetails, TextChoice, Timings, ToolCall,
                                     ToolCallDelta, Usage)
from edgespec.server.tool_calls import Call, CallStream, split_calls, template_arguments
from edgespec.server.engine_thread import EngineThread, Job

MAX_BODY_BYTES = 4 * 1024 * 1024
"""Largest request body (413 above it): a whole 128k-token conversation is about 1 MB of JSON."""
DRAIN_BYTES = 64 * 1024 * 1024
"""How much more of an over-long body is read (and dropped) so that the client sees
the 413 rather than a reset connection; past this the connection is closed."""
BODY_TIMEOUT_S = 60
"""How long a request body has to come whole once its headers have (a 408 after): a
client sending a byte a second held its connection forever. The largest body
(MAX_BODY_BYTES) comes in 60 s at 0.6 Mbit/s; an editor's, a few KB, at once."""
OPEN_PATHS = frozenset({"/health"})
"""Paths served without the API key (a load balancer's or a script's liveness check)."""
READ_METHODS = ["GET", "HEAD"]
"""The methods of every route that reads: HEAD answers as GET does, without the body
(HTTP's rule; monitors and link checkers send it). FastAPI's routes, unlike Starlette's,
do not add HEAD to GET themselves."""
PING_S = 15
"""Seconds between SSE keep-alive comments while a reply waits in the queue or runs."""
STOP_GRACE_S = 1.0
"""How long a stream has, once the server is told to stop, to send its last event and
`[DONE]` (less than the server's graceful shutdown, listen.GRACEFUL_S)."""


class StopNotice:
    """Told, from any thread, that the server is stopping (listen.run's signal handler):
    a request still waiting for its reply then gets a 503 in STOP_GRACE_S, as a stream
    gets its last event, instead of being cut when the graceful stop runs out."""

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._event: asyncio.Event | None = None

    def start(self) -> None:
        """On the server's event loop, before any request."""
        self._loop, self._event = asyncio.get_running_loop(), asyncio.Event()

    def set(self) -> None:
        if self._loop is not None and self._event is not None:
            try:
                self._loop.call_soon_threadsafe(self._event.set)
            except RuntimeError:  # the loop has closed (a signal after the server stopped): nothing waits
                pass

    async def wait(self) -> None:
        assert self._event is not None, "StopNotice.start() was not called"
        await self._event.wait()


@dataclass(frozen=True)
class ServerSettings:
    """What the server serves and how. Sampling settings in `defaults` apply to
    requests that leave them out."""

    model_id: str
    """The name clients use for the loaded model (a pair's or model's registry name)."""
    api_key: str | None = None
    """When set, every request but /health must send `Authorization: Bearer <api_key>`."""
    defaults: GenerationParams = field(default_factory=GenerationParams)
    max_tokens: int | None = SERVER_MAX_TOKENS
    """Reply limit for requests that set none; None: until the context is full (as OpenAI)."""
    template: str | None = None
    """A built-in chat format for a model whose GGUF has no chat template."""
    cors_origins: tuple[str, ...] = ()
    """Browser origins allowed to call the API (none by default)."""
    max_body_bytes: int = MAX_BODY_BYTES


def create_app(load: Callable[[], object], settings: ServerSettings) -> FastAPI:
    """The app. `load` returns a loaded Engine; it is called on the engine's own
    thread once the server is up (GET /health answers 503 until it returns), and
    the app closes the engine when it stops."""
    thread: EngineThread[Completer] = EngineThread(lambda: Completer(load(), template=settings.template),
                                                   fatal=(WorkerLostError,), idle=Completer.read_ahead)
    started = int(time.time())
    stopping = StopNotice()

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        stopping.start()
        thread.start()
        try:
            yield
        finally:
            await asyncio.to_thread(thread.stop)

    app = FastAPI(title="edgespec", version=__version__, lifespan=lifespan,
                  description="An OpenAI-compatible API over a target model, made faster by speculative decoding.",
                  responses={400: {"model": ErrorResponse}, 401: {"model": ErrorResponse},
                             503: {"model": ErrorResponse}})
    app.state.engine_thread = thread
    app.state.stopping = stopping
    app.state.settings = settings
    install_handlers(app)

    def completer() -> Completer:
        if thread.error is not None:
            raise ApiError(503, f"The model failed to load: {thread.error}", type="server_error")
        if not thread.ready:
            raise ApiError(503, "The model is loading; try again shortly.", type="server_error", code="model_loading")
        return thread.resource

    def check_model(name: str | None) -> None:
        served = {settings.model_id, completer().files["target"]}  # the draft model answers nothing
        if name is not None and name not in served:
            raise ApiError(404, f"The model '{name}' does not exist here: this server serves '{settings.model_id}'.",
                           param="model", code="model_not_found")

    @app.api_route("/health", methods=READ_METHODS, responses={503: {"model": ErrorResponse}})
    async def health():
        """200 once the model is loaded and the server takes requests; 503 before,
        and after an RPC worker was lost until a request has loaded the model again."""
        completer()
        if thread.lost is not None:
            raise api_error(thread.lost)
        return {"status": "ok", "queued": thread.queued}

    @app.api_route("/v1/models", methods=READ_METHODS, response_model=ModelList)
    @app.api_route("/v1/models/", methods=READ_METHODS, response_model=ModelList, include_in_schema=False)
    async def models():
        return ModelList(data=[_card(settings.model_id, started, thread)])

    # ":path": a hub-style name ("org/model") is a model's name too, answered as one not served
    # (the list's route, above, keeps "/v1/models/", which would be the name ""); a trailing
    # slash is no part of a name, as on every other route
    @app.api_route("/v1/models/{model_id:path}", methods=READ_METHODS, response_model=ModelCard)
    async def model(model_id: str):
        check_model(model_id.removesuffix("/"))
        return _card(settings.model_id, started, thread)

    @app.post("/v1/chat/completions", response_model=ChatCompletion)
    async def chat_completions(body: ChatCompletionRequest, request: Request):
        """A reply to a conversation, rendered with the model's chat template. With
        `stream`, server-sent `chat.completion.chunk` events and `data: [DONE]`."""
        check_model(body.model)
        params = _params(body, settings)
        messages = [_template_message(m) for m in body.messages]
        tools = body.callable_tools()
        reply_id = f"chatcmpl-{uuid.uuid4().hex[:24]}"
        job = thread.submit(lambda c: c.chat(messages, params, tools=tools, request_id=reply_id))
        return await _respond(request, job, body,
                              _ChatShape(reply_id, body.model or settings.model_id,
                                         tools=frozenset(t["function"]["name"] for t in tools) if tools else None),
                              prompt_param="messages", stopping=stopping)

    @app.post("/v1/completions", response_model=Completion)
    async def completions(body: CompletionRequest, request: Request):
        """The continuation of a raw prompt (no chat template; special tokens are parsed);
        with `suffix`, the text between the prompt and the suffix, for a model with
        fill-in-the-middle tokens (both texts plain: no special tokens parsed)."""
        check_model(body.model)
        params = _params(body, settings)
        reply_id = f"cmpl-{uuid.uuid4().hex[:24]}"
        job = thread.submit(lambda c: c.complete(body.prompt, params, suffix=body.suffix, request_id=reply_id))
        return await _respond(request, job, body, _TextShape(reply_id, body.model or settings.model_id),
                              prompt_param="prompt", stopping=stopping)

    app.openapi = lambda: _openapi(app)
    app.add_middleware(_Guard, api_key=settings.api_key, max_body=settings.max_body_bytes)
    if settings.cors_origins:  # outermost, so that preflight requests need no key
        # Any request header: the origin is what is trusted, and browser clients add their own
        # (the openai JavaScript SDK's X-Stainless-*).
        app.add_middleware(CORSMiddleware, allow_origins=list(settings.cors_origins),
                           allow_methods=["GET", "POST"], allow_headers=["*"])
    return app


def _openapi(app: FastAPI) -> dict:
    """The app's OpenAPI schema, built once, with each read route listed under GET alone
    (_listed). FastAPI's own lists it under GET and HEAD with one operationId, which OpenAPI
    wants unique (it warns "Duplicate Operation ID"), and that id ends in `_get` or `_head`
    by the run (it names whichever method of the route's set comes first)."""
    if app.openapi_schema is None:
        app.openapi_schema = get_openapi(
            title=app.title, version=app.version, openapi_version=app.openapi_version,
            description=app.description, routes=[_listed(route) for route in app.routes],
            separate_input_output_schemas=app.separate_input_output_schemas)
    return app.openapi_schema


def _listed(route):
    """`route` as the schema lists it: HEAD is GET without the body (READ_METHODS), so a read
    route is listed by its GET, under FastAPI's id for it."""
    if not isinstance(route, APIRoute) or "HEAD" not in route.methods:
        return route
    listed = copy.copy(route)
    listed.methods = route.methods - {"HEAD"}
    listed.unique_id = listed.operation_id or generate_unique_id(listed)
    return listed


def _card(model_id: str, created: int, thread: EngineThread) -> ModelCard:
    meta = {}
    if thread.ready:
        meta = {"files": thread.resource.files, "n_ctx": thread.resource.n_ctx}
    return ModelCard(id=model_id, created=created, meta=meta)


def _params(body, settings: ServerSettings) -> GenerationParams:
    """The request's settings over the server's defaults."""
    d = settings.defaults
    spec = body.speculation
    mode, k = reply_decoding(spec.mode if spec else None, spec.k if spec else None, (d.mode, d.k))
    return dataclasses.replace(
        d, mode=mode, k=k,
        temperature=d.temperature if body.temperature is None else body.temperature,
        top_p=d.top_p if body.top_p is None else body.top_p, top_k=d.top_k if body.top_k is None else body.top_k,
        seed=d.seed if body.seed is None else body.seed, max_tokens=body.reply_limit() or settings.max_tokens,
        stop=(*d.stop, *body.stops()),
    )


def _template_message(m: ChatMessage) -> dict:
    """A message as chat templates read it (Hugging Face's shape): a call's arguments as
    the JSON value they write, which templates render with `tojson`."""
    message = {"role": "system" if m.role == "developer" else m.role, "content": m.text()}
    if m.tool_calls:
        message["tool_calls"] = [{"id": c.id, "type": c.type, "function": {
            "name": c.function.name, "arguments": template_arguments(c.function.arguments)}} for c in m.tool_calls]
    if m.tool_call_id is not None:
        message["tool_call_id"] = m.tool_call_id
    return message


# -- responses ---------------------------------------------------------------------------------

def _usage(stats: Stats) -> Usage:
    return Usage(prompt_tokens=stats.prompt_tokens, completion_tokens=stats.generated_tokens,
                 total_tokens=stats.prompt_tokens + stats.generated_tokens,
                 prompt_tokens_details=PromptTokensDetails(cached_tokens=stats.prompt_cached))


def _timings(s: Stats) -> Timings:
    return Timings(
        prompt_n=s.prompt_evaluated, cache_n=s.prompt_cached, cache_from=s.prompt_cache,
        predicted_n=s.generated_tokens, predicted_ms=s.decode_s * 1000,
        predicted_per_second=s.tokens_per_s, draft_n=s.drafted, draft_n_accepted=s.accepted,
        accepted_by=dict(s.accepted_by), ttft_ms=s.ttft_s * 1000 if s.ttft_s is not None else None,
        mode=s.mode, drafter=s.drafter, k=s.k, acceptance_rate=s.acceptance_rate,
        tokens_per_pass=s.tokens_per_pass, target_passes=s.target_passes,
    )


@dataclass
class _Shape:
    """How a completion is worded, whole and in chunks; a chat's and a text's differ
    in their objects and choices only."""

    id: str
    model: str
    created: int = field(default_factory=lambda: int(time.time()))
    WHOLE: ClassVar[type]
    CHUNK: ClassVar[type]

    def _reply(self, cls, choices: list, **fields):
        return cls(id=self.id, created=self.created, model=self.model, choices=choices, **fields)

    def whole(self, text: str, done: Done):
        return self._reply(self.WHOLE, [self._choice(text, done.finish_reason)], usage=_usage(done.stats),
                           timings=_timings(done.stats))

    def chunk(self, text: str | None = None, *, role: bool = False, done: Done | None = None):
        return self._reply(self.CHUNK, [self._delta(text, role, done and done.finish_reason)],
                           timings=_timings(done.stats) if done else None)

    def chunks(self, text: str, *, done: Done | None = None) -> list:
        """The chunks that stream `text`, and with `done` the reply's last."""
        sent = self._text_chunks(text, ended=done is not None)
        return [*sent, self.chunk(done=done)] if done else sent

    def _text_chunks(self, text: str, *, ended: bool) -> list:
        """The chunks of `text` (`ended`: the reply's last text)."""
        return [self.chunk(text)] if text else []

    def usage_chunk(self, done: Done):
        return self._reply(self.CHUNK, [], usage=_usage(done.stats))


@dataclass
class _ChatShape(_Shape):
    tools: frozenset[str] | None = None
    """The names of the tools offered to call, if any: the reply's calls are then read (tool_calls)."""
    _stream: CallStream = field(init=False)
    WHOLE, CHUNK = ChatCompletion, ChatCompletionChunk

    def __post_init__(self) -> None:
        self._stream = CallStream(self.tools or frozenset())

    @property
    def calls(self) -> bool:
        return self.tools is not None

    def _choice(self, text: str, finish: str | None) -> ChatChoice:
        if not self.calls:
            return ChatChoice(message=AssistantMessage(content=text), finish_reason=finish)
        content, calls = split_calls(text, self.tools)
        message = AssistantMessage(content=content if content.strip() else None,
                                   tool_calls=[_tool_call(call) for call in calls] or None)
        return ChatChoice(message=message, finish_reason="tool_calls" if calls else finish)

    def _text_chunks(self, text: str, *, ended: bool) -> list:
        if not self.calls:
            return super()._text_chunks(text, ended=ended)
        before = self._stream.calls
        pieces = self._stream.feed(text) + (self._stream.finish() if ended else [])
        sent = []
        for piece in pieces:
            if isinstance(piece, str):
                sent.append(self.chunk(piece))
            else:
                call = _tool_call(piece, ToolCallDelta, index=before)
                sent.append(self._reply(self.CHUNK, [ChatChunkChoice(delta=ChatDelta(tool_calls=[call]))]))
                before += 1
        return sent

    def _delta(self, text: str | None, role: bool, finish: str | None) -> ChatChunkChoice:
        if finish and self._stream.calls:
            finish = "tool_calls"
        return ChatChunkChoice(delta=ChatDelta(role="assistant" if role else None, content=text), finish_reason=finish)


def _tool_call(call: Call, shape: type[ToolCall] = ToolCall, **fields) -> ToolCall:
    """`call` in OpenAI's shape (or a ToolCallDelta's, given its index), under an id of its own."""
    return shape(id=f"call_{uuid.uuid4().hex[:24]}", function=FunctionCall(name=call.name, arguments=call.arguments),
                 **fields)


class _TextShape(_Shape):
    WHOLE = CHUNK = Completion

    def _choice(self, text: str, finish: str | None) -> TextChoice:
        return TextChoice(text=text, finish_reason=finish)

    def _delta(self, text: str | None, role: bool, finish: str | None) -> TextChoice:
        return TextChoice(text=text or "", finish_reason=finish)


async def _respond(request: Request, job: Job, body, shape, *, prompt_param: str, stopping: StopNotice):
    """The response to a queued job: waits for its first result (an error then is an
    error response), then sends the whole reply or streams it. A server told to stop
    meanwhile answers 503 if the wait does not end within STOP_GRACE_S."""
    watcher = asyncio.create_task(_cancel_on_disconnect(request, job))
    try:
        first = await _unless_stopping(anext(job), stopping)
        if not body.stream:
            items = [first] + await _unless_stopping(_rest(job), stopping)
    except Exception as e:
        job.cancel()
        raise api_error(e, prompt_param=prompt_param) from None
    except BaseException:  # the server is stopping
        job.cancel()
        raise
    finally:
        watcher.cancel()
    if not body.stream:
        done = items[-1]
        return shape.whole("".join(item.text for item in items), done)
    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    stopping = anyio.Event()
    # The job is cancelled once the response ends, however it ended: the events' own cleanup
    # never runs for a client gone before they began, and the engine would write the reply to nobody.
    return EventSourceResponse(_events(job, first, shape, include_usage, stopping), ping=PING_S, sep="\n",
                               shutdown_event=stopping, shutdown_grace_period=STOP_GRACE_S,
                               background=BackgroundTask(job.cancel))


class _Stopping(Exception):
    """The server was told to stop while a reply streamed."""


async def _rest(job: Job) -> list:
    return [item async for item in job]


async def _unless_stopping(awaitable, stopping: StopNotice):
    """The awaitable's result; ApiError 503 where the server is told to stop and the
    result does not come within STOP_GRACE_S after."""
    work, stop = asyncio.ensure_future(awaitable), asyncio.ensure_future(stopping.wait())
    try:
        await asyncio.wait((work, stop), return_when=asyncio.FIRST_COMPLETED)
        if not work.done():
            await asyncio.wait((work,), timeout=STOP_GRACE_S)
        if work.done():
            return work.result()
        raise ApiError(503, "The request was not completed: the server is stopping.", type="server_error",
                       code="server_stopping")
    finally:
        work.cancel()
        stop.cancel()


async def _next(job: Job, stopping: anyio.Event):
    """The job's next item, unless the server is told to stop first (_Stopping)."""
    if stopping.is_set():
        raise _Stopping
    item = asyncio.ensure_future(anext(job))
    stop = asyncio.ensure_future(stopping.wait())
    try:
        done, _ = await asyncio.wait((item, stop), return_when=asyncio.FIRST_COMPLETED)
    finally:
        item.cancel()
        stop.cancel()
    if item in done:
        return item.result()
    raise _Stopping


async def _events(job: Job, first, shape, include_usage: bool, stopping: anyio.Event):
    """The SSE stream: OpenAI's chunks, then `[DONE]`. Closing it (the client went
    away) cancels the job, which frees the engine for the next request at once. A
    server told to stop ends it with an error event and `[DONE]`, so that a client
    can tell a stopped server from a dropped connection."""
    try:
        if isinstance(shape, _ChatShape):
            yield _json(shape.chunk("", role=True))
        item = first
        while True:
            done = None if isinstance(item, Delta) else item
            for chunk in shape.chunks(item.text, done=done):
                yield _json(chunk)
            if done is not None:
                if include_usage:
                    yield _json(shape.usage_chunk(item))
                yield "[DONE]"
                return
            item = await _next(job, stopping)
    except StopAsyncIteration:
        return
    except _Stopping:
        job.cancel()
        yield json.dumps(ApiError(503, "The server is stopping: the reply was cut short.", type="server_error",
                                  code="server_stopping").body())
        yield "[DONE]"
    except Exception as e:  # the headers are sent: the error goes in the stream, as OpenAI's does
        yield json.dumps(api_error(e).body())
    finally:
        job.cancel()


def _json(model) -> str:
    return model.model_dump_json()


def _declared_length(scope) -> int:
    """The request's Content-Length (0 when absent or not a number: the body is then counted as it comes)."""
    value = dict(scope["headers"]).get(b"content-length", b"")
    return int(value) if value.isdigit() else 0


async def _cancel_on_disconnect(request: Request, job: Job) -> None:
    """Cancel the job when the client disconnects (while it waits, or before a
    whole reply is sent)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            job.cancel()
            return


def _says_json(scope) -> bool:
    kind = dict(scope["headers"]).get(b"content-type", b"").split(b";")[0].strip().lower()
    return kind == b"application/json" or kind.endswith(b"+json")


class _Guard:
    """Pure ASGI middleware: reads the body before the app does, and refuses a body
    over the limit (413) or a request without the API key (401). A body is read as
    JSON whatever its content type says (`curl -d` sends a form's, some clients none),
    as llama-server and Ollama read it."""

    def __init__(self, app, *, api_key: str | None, max_body: int):
        self.app = app
        self.key_digest = hashlib.sha256(api_key.encode()).digest() if api_key is not None else None
        self.max_body = max_body

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        # A body declared past what would be drained is refused from the header, before any of it comes
        # (one that would be drained is read: its client, busy sending, then sees the 413, not a reset).
        if _declared_length(scope) > self.max_body + DRAIN_BYTES:
            return await self._too_large()(scope, receive, send)
        read = None
        with anyio.move_on_after(BODY_TIMEOUT_S) as reading:
            read = await self._read_body(receive)
        if reading.cancelled_caught:
            return await self._too_slow()(scope, receive, send)
        if read is None:  # the client went away
            return
        parts, size = read
        if size > self.max_body:
            return await self._too_large()(scope, receive, send)
        if self.key_digest is not None and scope["path"] not in OPEN_PATHS and not self._authorized(scope):
            error = ApiError(401, "Incorrect or missing API key: send it as 'Authorization: Bearer KEY'.",
                             code="invalid_api_key")
            return await error.response()(scope, receive, send)
        body = b"".join(parts)
        if body and not _says_json(scope):
            headers = [(name, value) for name, value in scope["headers"] if name != b"content-type"]
            scope = {**scope, "headers": [*headers, (b"content-type", b"application/json")]}
        replayed = False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _read_body(self, receive) -> tuple[list[bytes], int] | None:
        """The body's parts up to the limit, and its whole size (past the limit, as far as
        DRAIN_BYTES more); None if the client disconnects."""
        parts, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            chunk = message.get("body", b"")
            size += len(chunk)
            if size <= self.max_body:
                parts.append(chunk)
            if not message.get("more_body") or size > self.max_body + DRAIN_BYTES:
                return parts, size

    @staticmethod
    def _too_slow():
        response = ApiError(408, f"The request body did not come whole within {BODY_TIMEOUT_S} s.",
                            code="request_timeout").response()
        response.headers["connection"] = "close"  # the rest of the body is not read
        return response

    def _too_large(self):
        return ApiError(413, f"The request body is over {self.max_body} bytes, this server's limit.",
                        code="request_too_large").response()

    def _authorized(self, scope) -> bool:
        value = dict(scope["headers"]).get(b"authorization", b"")
        scheme, _, token = value.partition(b" ")
        # Digests have one length whatever was sent: the comparison takes the same time.
        return scheme.lower() == b"bearer" and hmac.compare_digest(
            hashlib.sha256(token.strip()).digest(), self.key_digest)


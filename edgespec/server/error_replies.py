"""Errors as the OpenAI API words them: a status and {"error": {message, type, param, code}}.

The one place that turns what went wrong in a request into a response: the
exception handlers installed by `install_handlers` map validation errors,
edgespec's typed errors and anything unexpected to OpenAI-shaped bodies.
"""

from __future__ import annotations

import logging
import re

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException

from edgespec.errors import (ContextFullError, EdgespecError, InvalidTokenError, NoFimTokensError, TemplateError,
                             ToolsNotTakenError, WorkerLostError, WorkerUnreachableError)
from edgespec.server.engine_thread import Cancelled

log = logging.getLogger("edgespec.server")


class ApiError(Exception):
    """A request that gets an error response."""

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status)


def api_error(exc: BaseException, *, prompt_param: str = "messages") -> ApiError:
    """The response for an exception raised while a request was served."""
    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, Cancelled):
        return ApiError(503, f"The request was not completed: {exc}.", type="server_error")
    if isinstance(exc, ContextFullError):
        return ApiError(400, str(exc), param=prompt_param, code="context_length_exceeded")
    if isinstance(exc, InvalidTokenError):
        return ApiError(400, f"{exc}.", param=prompt_param)
    if isinstance(exc, NoFimTokensError):
        return ApiError(400, str(exc), param="suffix")
    if isinstance(exc, ToolsNotTakenError):
        return ApiError(400, str(exc), param="tools")
    if isinstance(exc, TemplateError):
        return ApiError(400, str(exc), param="messages")
    if isinstance(exc, ValueError):  # a setting the engine refused (e.g. mode "draft" with no draft model)
        return ApiError(400, str(exc))
    if isinstance(exc, WorkerLostError):
        return ApiError(503, f"{exc.fact}. Start it again: the next request loads the model again.",
                        type="server_error", code="worker_lost")
    if isinstance(exc, WorkerUnreachableError):  # loading the model again after a lost worker: still away
        return ApiError(503, str(exc) if str(exc).endswith(".") else f"{exc}.", type="server_error",
                        code="worker_lost")
    if isinstance(exc, EdgespecError):
        return ApiError(500, str(exc), type="server_error")
    log.error("request failed", exc_info=exc)
    return ApiError(500, f"internal error ({type(exc).__name__}); the server's log has the details",
                    type="server_error")


_OTHER_ROUTE = {"prompt": ("messages", "/v1/chat/completions"), "messages": ("prompt", "/v1/completions")}
"""For a field a completions route requires: the field of the other route's body, and that route."""


def validation_error(exc: RequestValidationError) -> ApiError:
    """400 for a body that is not JSON, or whose fields have the wrong type or value."""
    errors = exc.errors()
    # Our own refusals (value errors) say more than the type errors of the other members of a union,
    # and of those the deepest says what to fix: a content part without its type, not "content
    # should be a string".
    first = next((e for e in errors if e.get("type") == "value_error"),
                 max(errors, key=lambda e: len(_field(e)), default={}))
    if first.get("type") == "json_invalid":
        return ApiError(400, f"The body is not valid JSON ({first.get('ctx', {}).get('error', 'parse error')}).")
    loc = _field(first)
    if not loc and first.get("type") in ("missing", "model_type", "model_attributes_type", "dict_type"):
        # the body itself: empty, or JSON but not an object
        sent = "none was sent" if first.get("type") == "missing" else "got another JSON value"
        return ApiError(400, f"The request body must be a JSON object ({sent}).")
    param = ".".join(loc) or None
    message = str(first.get("msg", "invalid request")).removeprefix("Value error, ")
    message = re.sub(r"a valid dictionary( or (object to extract fields from|instance of \w+))?", "a JSON object",
                     message)  # pydantic's words for a JSON object, and our class names
    if first.get("type") == "missing":
        message = f"'{param}' is required"
        other = _OTHER_ROUTE.get(param or "")
        if other and isinstance(exc.body, dict) and other[0] in exc.body:  # the body of the other route
            message += f": a body with '{other[0]}' goes to {other[1]}."
    elif param and not re.search(rf"\b{re.escape(loc[-1])}\b", message):  # ("n" is in "Input")
        message = f"{param}: {message}"
    # A union's members each report the field, or a place above the one chosen: no other error.
    others = {field for field in map(tuple, map(_field, errors)) if tuple(loc[:len(field)]) != field}
    more = f" (and {len(others)} more)" if others else ""
    return ApiError(400, message + more, param=param)


def unreadable_body(cause: ValueError | RecursionError) -> ApiError:
    """400 for a body that json.loads refused with other than a syntax error (that one is
    a validation error): bytes that are not UTF-8, or past Python's limits."""
    if isinstance(cause, UnicodeDecodeError):
        why = (f"is not UTF-8 text (byte 0x{cause.object[cause.start]:02x} at offset {cause.start}): "
               f"JSON is sent in UTF-8")
    elif isinstance(cause, RecursionError):
        why = "is nested too deeply to read"
    elif limit := re.search(r"limit \((\d+) digits\)", str(cause)):  # int("9" * 5000): Python's digit limit
        why = f"is not JSON this server reads: a number has more than {limit[1]} digits"
    else:
        why = f"could not be read as JSON ({cause})"
    return ApiError(400, f"The body {why}.")


def _field(error: dict) -> list[str]:
    return [str(part) for part in error.get("loc", ()) if part != "body" and not _is_type_tag(part)]


def _is_type_tag(part) -> bool:
    """Pydantic names the member of a union it tried ("str", "list[str]") in an error's location."""
    return isinstance(part, str) and (part in ("str", "int", "float", "bool", "dict", "list") or "[" in part)


def _where_the_api_is(app: FastAPI) -> str:
    """The API's routes, for a client that asked for a path not served (often a base URL without /v1)."""
    routes = [f"{method} {route.path}" for route in app.routes if isinstance(route, APIRoute)
              and route.include_in_schema and route.path.startswith("/v1/") and "{" not in route.path
              for method in sorted(route.methods - {"HEAD"})]
    return f"the API is under /v1 ({', '.join(routes)}), so a client's base URL ends in /v1."


def install_handlers(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def _api(request: Request, exc: ApiError):
        return exc.response()

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError):
        return validation_error(exc).response()

    @app.exception_handler(HTTPException)
    async def _http(request: Request, exc: HTTPException):
        if exc.status_code == 400 and isinstance(exc.__cause__, (ValueError, RecursionError)):
            return unreadable_body(exc.__cause__).response()  # FastAPI's own words name no cause
        message = str(exc.detail)
        if exc.status_code == 404:  # no such route (a model not served is an ApiError of its own)
            message = f"Invalid URL ({request.method} {request.url.path}): {_where_the_api_is(request.app)}"
        response = ApiError(exc.status_code, message).response()
        response.headers.update(exc.headers or {})  # a 405's Allow, as HTTP asks
        return response

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception):
        return api_error(exc).response()

"""`edgespec serve` end to end: a real uvicorn server on a free 127.0.0.1 port,
SmolLM2-135M underneath, and the real `openai` client in front."""

from __future__ import annotations

import http.client as http_client
import json
import re
import socket
import logging
import threading
import time
import urllib.error
import urllib.request
import warnings
from concurrent.futures import ThreadPoolExecutor

import pytest

pytest.importorskip("fastapi", reason="needs the serve extra: pip install 'edgespec[serve]'")
openai = pytest.importorskip("openai", reason="needs the test extra: pip install 'edgespec[test]'")

from edgespec import cli  # noqa: E402
from edgespec.chat.template import chat_template  # noqa: E402
from edgespec.cli.options import params_from_args  # noqa: E402
from edgespec.cli.serve import API_KEY_ENV  # noqa: E402
from edgespec.engine.cache import common_prefix_length  # noqa: E402
from edgespec.engine.events import Chunk, GenerationParams, Stats  # noqa: E402
from edgespec.engine.runtime import Engine, ModelSettings  # noqa: E402
from edgespec.errors import (  # noqa: E402
    ContextFullError, ModelFileError, ServeError, WorkerLostError, WorkerUnreachableError,
)
from edgespec.net import is_loopback  # noqa: E402
from edgespec.server import ServerSettings, bind, check_exposure, create_app, run  # noqa: E402
from tests.fakes import FakeEngine, SlowReader  # noqa: E402
from tests.server_helpers import KEY, ServerThread, http  # noqa: E402
from tests.synthetic import FIM as SYNTHETIC_FIM  # noqa: E402
from tests.synthetic import FIRST_WORD, write_model  # noqa: E402

MODEL = "smollm2"
CTX = 1024
QUESTION = [{"role": "user", "content": "Name three colours."}]


# -- no model needed ----------------------------------------------------------------------------

def test_only_loopback_addresses_are_served_without_an_api_key():
    assert is_loopback("127.0.0.1") and is_loopback("localhost") and is_loopback("::1")
    assert not is_loopback("0.0.0.0") and not is_loopback("192.168.1.5") and not is_loopback("myhost")
    assert check_exposure("127.0.0.1", api_key=None, allow_no_key=False) is None
    assert check_exposure("0.0.0.0", api_key="k", allow_no_key=False) is None
    assert "NO API key" in check_exposure("0.0.0.0", api_key=None, allow_no_key=True)


@pytest.mark.parametrize("host", ["bad host!", "", " ", "exa mple.com", "[::1", "host:80"])
def test_a_host_that_is_not_an_address_is_named_as_such_not_as_an_exposure(host):
    for key in (None, "k"):
        with pytest.raises(ServeError, match="not a host name or an IP address"):
            check_exposure(host, api_key=key, allow_no_key=False)
    assert check_exposure("my-host.example", api_key="k", allow_no_key=False) is None
    assert check_exposure("[::1]", api_key=None, allow_no_key=False) is None


def test_serve_refuses_an_exposed_address_without_a_key_before_loading_anything(capsys, monkeypatch):
    monkeypatch.delenv(API_KEY_ENV, raising=False)
    assert cli.main(["serve", "--host", "0.0.0.0", "--target", "/nonexistent/model.gguf"]) == cli.EXIT_ERROR
    err = capsys.readouterr().err
    assert "--api-key" in err and "model.gguf" not in err


def test_serve_without_max_tokens_leaves_replies_unlimited():
    args = cli.build_parser().parse_args(["serve"])
    assert params_from_args(args).max_tokens is None  # no TypeError: the reply runs until the context is full


def test_health_is_503_while_the_model_loads_then_200():
    loading = threading.Event()
    release = threading.Event()

    def load():
        loading.set()
        release.wait(30)
        return FakeEngine()

    served = ServerThread(create_app(load, ServerSettings(model_id="fake")))
    try:
        assert loading.wait(30)
        status, body = http("GET", served.url + "/health")
        assert status == 503 and body["error"]["code"] == "model_loading"
        status, body = http("POST", served.url + "/v1/completions", json.dumps({"prompt": "hi"}).encode())
        assert status == 503
        release.set()
        served.wait_ready(30)
        status, body = http("POST", served.url + "/v1/completions",
                            json.dumps({"prompt": "hi", "max_tokens": 3}).encode())
        assert status == 200 and body["choices"][0]["text"] == "rep"
    finally:
        release.set()
        served.stop()


@pytest.mark.parametrize("message, param, words", [
    ({"role": "user", "content": None}, "messages.0.content", "needs content"),
    ({"role": "user"}, "messages.0.content", "needs content"),
    ({"role": "system", "content": None}, "messages.0.content", "needs content"),
    ({"role": "user", "content": [{"type": "text"}]}, "messages.0.content", "'text'"),
    ({"role": "user", "content": []}, "messages.0.content", "needs content"),
])
def test_a_message_without_its_text_is_a_400_that_says_so(message, param, words):
    """As OpenAI answers: only an assistant message may come without content."""
    served = ServerThread(create_app(FakeEngine, ServerSettings(model_id="fake", template="chatml")))
    try:
        served.wait_ready(30)
        status, body = http("POST", served.url + "/v1/chat/completions",
                            json.dumps({"messages": [message], "max_tokens": 3}).encode())
        assert status == 400 and body["error"]["param"].startswith(param), body
        assert words in body["error"]["message"]
        history = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": None},
                   {"role": "user", "content": "again"}]
        status, _ = http("POST", served.url + "/v1/chat/completions",
                         json.dumps({"messages": history, "max_tokens": 3}).encode())
        assert status == 200
    finally:
        served.stop()


def test_a_messages_text_parts_reach_the_model_on_lines_of_their_own():
    """Agents send a message as several text parts (the task, then the environment's
    details): joined with nothing, "Fix this:" and "def f()" became "Fix this:def f()".
    llama-server joins them with a newline."""
    engine = FakeEngine()
    served = ServerThread(create_app(lambda: engine, ServerSettings(model_id="fake", template="chatml")))
    try:
        served.wait_ready(30)
        parts = [{"type": "text", "text": "Fix this:"}, {"type": "text", "text": "def f(): pass"}]
        status, answer = http("POST", served.url + "/v1/chat/completions",
                              json.dumps({"messages": [{"role": "user", "content": parts}], "max_tokens": 3}).encode())
        assert status == 200, answer
        assert "Fix this:\ndef f(): pass" in engine.detokenize(engine.prompts[-1])
    finally:
        served.stop()


@pytest.mark.parametrize("path, body, param", [
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "a\ud800b"}]}, "messages.0.content"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": "text", "text": "\udfff"}]}]},
     "messages.0.content"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "stop": ["\ud83d"]}, "stop"),
    ("/v1/completions", {"prompt": "x\udc80"}, "prompt"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "model": "gpt\udfff"}, "model"),
])
def test_a_lone_surrogate_in_a_text_is_a_400_that_names_it(path, body, param):
    served = ServerThread(create_app(FakeEngine, ServerSettings(model_id="fake", template="chatml")))
    try:
        served.wait_ready(30)
        status, answer = http("POST", served.url + path, json.dumps(body).encode())
        assert status == 400 and answer["error"]["param"].startswith(param), answer
        assert "surrogate" in answer["error"]["message"] and "codec" not in answer["error"]["message"]
    finally:
        served.stop()


@pytest.mark.parametrize("path, body", [
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "stream": None, "n": None,
                              "presence_penalty": None, "frequency_penalty": None,
                              "stream_options": {"include_usage": None}}),
    ("/v1/completions", {"prompt": "hi", "echo": None, "n": None, "stream": None, "best_of": None}),
])
def test_null_stands_for_a_fields_default_where_openai_allows_it(path, body):
    """OpenAI's schema lets every optional field be null (a client may send each unset
    one so): null is its default, as for the fields that were nullable already."""
    served = ServerThread(create_app(FakeEngine, ServerSettings(model_id="fake", template="chatml")))
    try:
        served.wait_ready(30)
        status, answer = http("POST", served.url + path, json.dumps({**body, "max_tokens": 3}).encode())
        assert status == 200, answer
        assert answer["object"] in ("chat.completion", "text_completion")  # not streamed
    finally:
        served.stop()


@pytest.mark.parametrize("content_type", [None, "text/plain", "application/x-www-form-urlencoded"])
def test_a_json_body_is_read_whatever_its_content_type_says(content_type):
    """`curl -d '{...}'` sends a form's content type, and some clients send none: a JSON
    body is read as JSON all the same (as llama-server and Ollama read it); it was refused
    as "not a JSON object"."""
    served = ServerThread(create_app(FakeEngine, ServerSettings(model_id="fake")))
    try:
        served.wait_ready(30)
        host, port = served.url.removeprefix("http://").rsplit(":", 1)
        connection = http_client.HTTPConnection(host, int(port), timeout=30)
        headers = {"Content-Type": content_type} if content_type else {}
        connection.request("POST", "/v1/completions", completion_body(max_tokens=3), headers)
        response = connection.getresponse()
        answer = json.loads(response.read())
        connection.close()
        assert response.status == 200, answer
        assert answer["choices"][0]["text"]
    finally:
        served.stop()


def test_a_request_names_the_served_model_by_its_name_or_its_target_file_not_the_draft_file():
    """The draft model answers nothing: naming its file is naming a model not served
    (it was answered by the target, and the response named the draft)."""
    from tests.fakes import engine_info, model_info

    class Paired(FakeEngine):
        def describe(self):
            return engine_info({"target": model_info("big.gguf"), "draft": model_info("small.gguf")})

    served = ServerThread(create_app(Paired, ServerSettings(model_id="pair")))
    try:
        served.wait_ready(30)
        for name, status in (("pair", 200), ("big.gguf", 200), ("small.gguf", 404)):
            answer = http("POST", served.url + "/v1/completions", completion_body(model=name))
            assert answer[0] == status, (name, answer)
        status, answer = http("POST", served.url + "/v1/completions", completion_body(n="two"))
        assert status == 400 and answer["error"]["message"].startswith("n: "), answer
    finally:
        served.stop()


@pytest.mark.parametrize("name", ["org/other-model", "fake/x"])
def test_a_model_name_with_a_slash_is_answered_as_a_model_not_served(name):
    """Hub-style names ("org/model") are common: GET /v1/models/org/model answered
    "Invalid URL ... the API is under /v1", which sends the client looking for a wrong base URL."""
    served = ServerThread(create_app(FakeEngine, ServerSettings(model_id="fake")))
    try:
        served.wait_ready(30)
        status, answer = http("GET", served.url + "/v1/models/" + name)
        assert status == 404 and answer["error"]["code"] == "model_not_found", answer
        assert http("GET", served.url + "/v1/models/fake")[0] == http("GET", served.url + "/v1/models/fake/")[0] == 200
        status, answer = http("GET", served.url + "/v1/models/")  # the list still, not a model named ""
        assert status == 200 and answer["data"][0]["id"] == "fake", answer
    finally:
        served.stop()


@pytest.mark.parametrize("body", [b"", b"null", b"[]", b'"hi"'])
def test_a_body_that_is_not_a_json_object_says_so(body):
    served = ServerThread(create_app(FakeEngine, ServerSettings(model_id="fake", template="chatml")))
    try:
        served.wait_ready(30)
        for path in ("/v1/chat/completions", "/v1/completions"):
            status, answer = http("POST", served.url + path, body)
            assert status == 400 and "None" not in answer["error"]["message"], answer
            assert "JSON object" in answer["error"]["message"]
    finally:
        served.stop()


@pytest.mark.parametrize("body, words", [
    (b'{"prompt": "caf\xe9", "max_tokens": 3}', "not UTF-8 text (byte 0xe9 at offset 15)"),
    (b'{"prompt": "hi", "max_tokens": ' + b"9" * 5000 + b"}", "a number has more than 4300 digits"),
    (b'{"prompt": "hi", "user": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "nested too deeply"),
])
def test_a_body_json_cannot_read_says_why(body, words):
    """A body in Latin-1 (a script that skips .encode()), a number past Python's digit
    limit, or nesting past its recursion limit: each got "There was an error parsing the
    body", which names none of them."""
    served = ServerThread(create_app(FakeEngine, ServerSettings(model_id="fake")))
    try:
        served.wait_ready(30)
        status, answer = http("POST", served.url + "/v1/completions", body)
        assert status == 400 and answer["error"]["type"] == "invalid_request_error", answer
        assert words in answer["error"]["message"] and "set_int_max_str_digits" not in answer["error"]["message"]
        assert http("POST", served.url + "/v1/completions", completion_body(max_tokens=3))[0] == 200
    finally:
        served.stop()


@pytest.mark.parametrize("path, fields, param", [
    ("/v1/chat/completions", {"logprobs": True}, "logprobs"),
    ("/v1/chat/completions", {"top_logprobs": 3}, "top_logprobs"),
    ("/v1/chat/completions", {"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"),  # chatml takes none
    ("/v1/chat/completions", {"functions": [{"name": "f"}]}, "functions"),
    ("/v1/chat/completions", {"function_call": "auto"}, "function_call"),
    ("/v1/chat/completions", {"tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "required"},
     "tool_choice"),
    ("/v1/chat/completions", {"functions": [{"name": "f"}], "tool_choice": "none"}, "functions"),
    ("/v1/chat/completions", {"response_format": {"type": "json_object"}}, "response_format"),
    ("/v1/completions", {"echo": True}, "echo"),
    ("/v1/completions", {"logprobs": 2}, "logprobs"),
    ("/v1/completions", {"best_of": 3}, "best_of"),
])
def test_an_unsupported_feature_is_refused_naming_its_field(path, fields, param):
    """OpenAI's error names the offending field in `param`, which a client shows or
    acts on; these refusals came with param null."""
    served = ServerThread(create_app(FakeEngine, ServerSettings(model_id="fake", template="chatml")))
    try:
        served.wait_ready(30)
        base = {"messages": QUESTION} if "chat" in path else {"prompt": "hi"}
        status, answer = http("POST", served.url + path, json.dumps({**base, **fields, "max_tokens": 3}).encode())
        assert status == 400 and answer["error"]["param"] == param, answer
        assert "not supported" in answer["error"]["message"]
    finally:
        served.stop()


FIM = ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>")


def test_a_suffix_asks_a_model_with_fill_in_the_middle_tokens_for_the_middle():
    """Editors' autocomplete sends the text before the cursor as the prompt and the text
    after it as `suffix`; the model reads them between its FIM tokens (prefix, suffix,
    middle order, as llama-server's infill). Both are the user's text: one holding a FIM
    token's text stays text, else a file could end the prefix or open the middle."""
    engine = FakeEngine(fim=FIM)
    pre, suf, mid = engine.fim_tokens
    server = ServerThread(create_app(lambda: engine, ServerSettings(model_id="fake")))
    try:
        server.wait_ready(30)
        before, after = "def f(<|fim_suffix|>", "<|fim_middle|>):\n"
        status, body = http("POST", server.url + "/v1/completions", completion_body(prompt=before, suffix=after))
        assert status == 200 and body["choices"][0]["text"] == "reply"
        text = lambda t: engine.tokenize(t, special=False)  # noqa: E731
        assert engine.prompts[-1] == [engine.bos, pre, *text(before), suf, *text(after), mid]
        assert engine.prompts[-1].count(suf) == engine.prompts[-1].count(mid) == 1
        status, _ = http("POST", server.url + "/v1/completions", completion_body(prompt="", suffix="x"))
        assert status == 200 and engine.prompts[-1] == [engine.bos, pre, suf, ord("x"), mid]  # the file's start
        status, _ = http("POST", server.url + "/v1/completions", completion_body(prompt="x<s>", suffix=""))
        assert status == 200 and engine.prompts[-1] == engine.tokenize("x<s>", add_bos=True)  # no suffix: as before
    finally:
        server.stop()


@pytest.mark.parametrize("prompt, param, words", [
    ("def f(", "suffix", "has no fill-in-the-middle tokens"),
    ([104, 105], "prompt", "token ids"),
])
def test_a_suffix_is_refused_for_a_model_without_fim_tokens_or_with_token_ids(prompt, param, words):
    engine = FakeEngine(fim=FIM) if isinstance(prompt, list) else FakeEngine()
    server = ServerThread(create_app(lambda: engine, ServerSettings(model_id="fake")))
    try:
        server.wait_ready(30)
        status, body = http("POST", server.url + "/v1/completions", completion_body(prompt=prompt, suffix=")"))
        assert status == 400 and body["error"]["param"] == param, body
        assert words in body["error"]["message"] and "not supported" in body["error"]["message"]
        assert not engine.prompts
    finally:
        server.stop()


@pytest.mark.parametrize("fields", [
    {"tools": [{"type": "function", "function": {"name": "get_weather"}}], "tool_choice": "none"},
    {"functions": [{"name": "get_weather"}], "function_call": "none"},
])
def test_tools_the_model_may_not_call_are_accepted_and_not_rendered(fields):
    """With tool_choice "none" the model calls no tool and writes a message (OpenAI's
    rule), which a server without tool calling can do: such a request was refused."""
    engine = FakeEngine()
    served = ServerThread(create_app(lambda: engine, ServerSettings(model_id="fake", template="chatml")))
    try:
        served.wait_ready(30)
        status, answer = http("POST", served.url + "/v1/chat/completions",
                              json.dumps({"messages": QUESTION, **fields, "max_tokens": 3}).encode())
        assert status == 200, answer
        assert "get_weather" not in engine.detokenize(engine.prompts[-1])
    finally:
        served.stop()


def test_an_allowed_origin_may_send_the_headers_the_openai_sdk_adds_without_the_key_in_its_preflight():
    """The openai JavaScript SDK in a browser sends X-Stainless-* headers with every request:
    a preflight that names them was refused ("Disallowed CORS headers"), so no browser
    client built on it could call the server from an allowed origin."""
    served = ServerThread(create_app(FakeEngine, ServerSettings(model_id="fake", api_key=KEY,
                                                                cors_origins=("http://app.example",))))
    try:
        served.wait_ready(30)
        port = served.sock.getsockname()[1]

        def preflight(origin):
            connection = http_client.HTTPConnection("127.0.0.1", port, timeout=30)
            connection.request("OPTIONS", "/v1/chat/completions", headers={
                "Origin": origin, "Access-Control-Request-Method": "POST",
                "Access-Control-Request-Headers": "authorization,content-type,x-stainless-os,x-stainless-retry-count"})
            response = connection.getresponse()
            response.read()
            connection.close()
            return response

        allowed = preflight("http://app.example")
        assert allowed.status == 200 and allowed.headers["Access-Control-Allow-Origin"] == "http://app.example"
        assert "x-stainless-os" in allowed.headers["Access-Control-Allow-Headers"].lower()
        assert "Access-Control-Allow-Origin" not in preflight("http://other.example").headers
    finally:
        served.stop()


@pytest.mark.parametrize("field, value", [("temperature", b"NaN"), ("top_p", b"NaN"), ("temperature", b"Infinity"),
                                          ("top_p", b"-Infinity")])
def test_a_number_that_is_not_finite_is_named_as_such(field, value):
    """Python's json reads NaN and Infinity (JavaScript's JSON.stringify never writes them,
    but Python clients do): NaN was refused as not "less than or equal to 2"."""
    served = ServerThread(create_app(FakeEngine, ServerSettings(model_id="fake")))
    try:
        served.wait_ready(30)
        body = b'{"prompt": "hi", "max_tokens": 3, "' + field.encode() + b'": ' + value + b"}"
        status, answer = http("POST", served.url + "/v1/completions", body)
        assert status == 400 and answer["error"]["param"] == field, answer
        assert "finite" in answer["error"]["message"]
    finally:
        served.stop()


@pytest.mark.parametrize("path, hint", [("/chat/completions", "/v1/chat/completions"), ("/v1/chat/completion", "/v1"),
                                        ("/", "/v1")])
def test_a_path_not_served_is_named_with_where_the_api_is(path, hint):
    """A client given the base URL without /v1 (or a path with a typo) got "Not Found":
    as OpenAI's, the answer names the method and path, and here also where the API is."""
    served = ServerThread(create_app(FakeEngine, ServerSettings(model_id="fake")))
    try:
        served.wait_ready(30)
        status, answer = http("POST", served.url + path, completion_body())
        assert status == 404 and answer["error"]["type"] == "invalid_request_error", answer
        assert f"POST {path}" in answer["error"]["message"] and hint in answer["error"]["message"]
        assert "/v1/models/" not in answer["error"]["message"]  # a route kept for a trailing slash is no news
    finally:
        served.stop()


@pytest.mark.parametrize("content, param, words", [
    ([{"text": "a"}], "messages.0.content.0.type", "'messages.0.content.0.type' is required"),
    (["a"], "messages.0.content.0", "should be a JSON object"),
])
def test_a_wrong_content_part_is_named_not_the_other_shape_content_may_have(content, param, words):
    """Content is a text or a list of parts: a part without its type, or a bare string in
    the list, was answered "messages.0.content: Input should be a valid string", the other
    shape's complaint, which does not say what to fix."""
    served = ServerThread(create_app(FakeEngine, ServerSettings(model_id="fake", template="chatml")))
    try:
        served.wait_ready(30)
        body = {"messages": [{"role": "user", "content": content}], "max_tokens": 3}
        status, answer = http("POST", served.url + "/v1/chat/completions", json.dumps(body).encode())
        assert status == 400 and answer["error"]["param"] == param, answer
        assert words in answer["error"]["message"] and "ContentPart" not in answer["error"]["message"]
        assert "more)" not in answer["error"]["message"]  # the other shape's complaint is no second error
    finally:
        served.stop()


def test_an_image_part_is_refused_as_one_error_and_two_wrong_fields_as_two():
    served = ServerThread(create_app(FakeEngine, ServerSettings(model_id="fake", template="chatml")))
    try:
        served.wait_ready(30)
        image = [{"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]
        for fields, more in (({"messages": [{"role": "user", "content": image}]}, ""),
                             ({"messages": QUESTION, "temperature": "hot", "top_p": 5}, " (and 1 more)")):
            status, answer = http("POST", served.url + "/v1/chat/completions", json.dumps(fields).encode())
            message = answer["error"]["message"]
            assert status == 400 and message.endswith(more) and ("more)" in message) == bool(more), answer
    finally:
        served.stop()


@pytest.mark.parametrize("path, body, words", [
    ("/v1/completions", {"messages": QUESTION}, "/v1/chat/completions"),
    ("/v1/chat/completions", {"prompt": "hi"}, "/v1/completions"),
])
def test_a_body_sent_to_the_other_completions_route_says_where_it_goes(path, body, words):
    """A chat's messages posted to /v1/completions (or a raw prompt to the chat route)
    was only "'prompt' is required", which reads as a misspelt field."""
    served = ServerThread(create_app(FakeEngine, ServerSettings(model_id="fake", template="chatml")))
    try:
        served.wait_ready(30)
        status, answer = http("POST", served.url + path, json.dumps(body).encode())
        assert status == 400 and answer["error"]["message"].endswith(f"goes to {words}."), answer
        assert answer["error"]["param"] in ("prompt", "messages"), answer
    finally:
        served.stop()


def test_a_wrong_method_says_which_are_allowed_and_head_works_where_get_does():
    served = ServerThread(create_app(FakeEngine, ServerSettings(model_id="fake")))
    try:
        served.wait_ready(30)
        for path, allowed in [("/v1/chat/completions", {"POST"}), ("/health", {"GET", "HEAD"}),
                              ("/v1/models", {"GET", "HEAD"})]:
            wrong = "GET" if "POST" in allowed else "DELETE"
            request = urllib.request.Request(served.url + path, method=wrong)
            with pytest.raises(urllib.error.HTTPError) as e:
                urllib.request.urlopen(request, timeout=30)
            assert e.value.code == 405
            assert {m.strip() for m in e.value.headers["Allow"].split(",")} == allowed, path
            assert json.loads(e.value.read())["error"]["message"]
        for path in ("/health", "/v1/models"):
            with urllib.request.urlopen(urllib.request.Request(served.url + path, method="HEAD"), timeout=30) as r:
                assert r.status == 200 and r.read() == b""
    finally:
        served.stop()


def test_every_get_route_answers_head_as_get_does_without_a_body():
    """HTTP's rule: HEAD answers as GET does, with no body (monitors and link checkers
    send it); HEAD on /v1/models/{id} was a 405 while GET answered 200."""
    app = create_app(FakeEngine, ServerSettings(model_id="fake"))
    paths = [re.sub(r"\{model_id.*\}", "fake", route.path) for route in app.routes if "GET" in route.methods]
    assert "/v1/models/fake" in paths
    served = ServerThread(app)
    try:
        served.wait_ready(30)
        for path in [*paths, "/v1/models/other"]:
            get = urllib.request.Request(served.url + path, headers={"Authorization": f"Bearer {KEY}"})
            head = urllib.request.Request(served.url + path, method="HEAD")
            answers = []
            for request in (get, head):
                try:
                    with urllib.request.urlopen(request, timeout=30) as response:
                        answers.append((response.status, response.read()))
                except urllib.error.HTTPError as e:
                    answers.append((e.code, e.read()))
            (get_status, get_body), (head_status, head_body) = answers
            assert head_status == get_status and head_body == b"" and get_body, path
    finally:
        served.stop()


def test_the_openapi_schema_builds_without_warnings_one_operation_id_each():
    """Each read route answers GET and HEAD; listed under both, its two operations shared
    one operationId (OpenAPI wants each unique), and building the schema warned "Duplicate
    Operation ID" three times; the id ended in `_get` or `_head` by the run. The schema lists
    the GET, under FastAPI's id for it; HEAD is GET without the body."""
    app = create_app(FakeEngine, ServerSettings(model_id="fake"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        schema = app.openapi()
    assert not [w for w in caught if "Operation ID" in str(w.message)]
    ids = [operation["operationId"] for path in schema["paths"].values() for operation in path.values()]
    assert len(ids) == len(set(ids)), ids
    assert {path: set(operations) for path, operations in schema["paths"].items()} == {
        "/health": {"get"}, "/v1/models": {"get"}, "/v1/models/{model_id}": {"get"},
        "/v1/chat/completions": {"post"}, "/v1/completions": {"post"}}
    assert [schema["paths"][path]["get"]["operationId"] for path in ("/health", "/v1/models")] == [
        "health_health_get", "models_v1_models_get"]


@pytest.mark.parametrize("declared", [99_999_999_999, 100 * 1024 * 1024])
def test_a_body_declared_too_large_is_refused_from_its_header_without_waiting_for_it(declared):
    served = ServerThread(create_app(FakeEngine, ServerSettings(model_id="fake")))
    try:
        served.wait_ready(30)
        connection = http_client.HTTPConnection("127.0.0.1", served.sock.getsockname()[1], timeout=10)
        connection.putrequest("POST", "/v1/chat/completions")
        connection.putheader("Content-Type", "application/json")
        connection.putheader("Content-Length", str(declared))
        connection.endheaders(b'{"messages": ')  # and nothing more: the server must not wait for the rest
        response = connection.getresponse()
        assert response.status == 413
        assert json.loads(response.read())["error"]["code"] == "request_too_large"
        connection.close()
    finally:
        served.stop()


@pytest.mark.parametrize("name, size, pieces", [("Authorization", 1_000_000, 1), ("Authorization", 200_000, 50),
                                               ("X-Filler", 3_000_000, 1),
                                               # whole heads a little over the limit, read at once (they were served)
                                               ("X-Filler", 70_000, 1), ("X-Filler", 250_000, 1),
                                               ("Authorization", 100_000, 2)])
def test_request_headers_too_large_get_a_431_the_client_can_read(name, size, pieces):
    """A head over the limit, sent at once or in pieces, is answered with a 431
    in OpenAI's format (it was a reset connection), and the server goes on."""
    served = ServerThread(create_app(FakeEngine, ServerSettings(model_id="fake", api_key=KEY)))
    try:
        served.wait_ready(30)
        head = f"GET /v1/models HTTP/1.1\r\nHost: x\r\n{name}: Bearer {'a' * size}\r\n\r\n".encode()
        with socket.create_connection(("127.0.0.1", served.sock.getsockname()[1]), timeout=30) as connection:
            step = len(head) // pieces + 1
            try:
                for i in range(0, len(head), step):
                    connection.sendall(head[i:i + step])
            except (BrokenPipeError, ConnectionResetError):
                pass  # the server had read enough; its answer is waiting
            answer = b""
            while chunk := connection.recv(65536):
                answer += chunk
        status, _, rest = answer.partition(b"\r\n")
        assert status.split()[1] == b"431", answer[:200]
        assert json.loads(rest.partition(b"\r\n\r\n")[2])["error"]["code"] == "request_header_fields_too_large"
        assert http("GET", served.url + "/v1/models")[0] == 200
    finally:
        served.stop()


def test_request_headers_just_under_the_limit_are_served():
    served = ServerThread(create_app(FakeEngine, ServerSettings(model_id="fake")))
    try:
        served.wait_ready(30)
        head = f"GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\nX-Filler: {'a' * 60_000}\r\n\r\n"
        with socket.create_connection(("127.0.0.1", served.sock.getsockname()[1]), timeout=30) as connection:
            connection.sendall(head.encode())
            answer = b""
            while chunk := connection.recv(65536):
                answer += chunk
        assert answer.split(b"\r\n", 1)[0].split()[1] == b"200", answer[:200]
    finally:
        served.stop()


@pytest.mark.parametrize("sent", [b"", b"GET /v1/models HTTP/1.1\r\nHost: x\r\n"])
def test_a_request_head_that_does_not_come_whole_in_time_has_its_connection_closed(monkeypatch, sent):
    """A client that sends its head a byte at a time (slowloris), or nothing at all, held
    its connection forever: uvicorn times out only a connection idle after a response."""
    from edgespec.server import listen

    monkeypatch.setattr(listen, "HEAD_TIMEOUT_S", 0.5)
    served = ServerThread(create_app(FakeEngine, ServerSettings(model_id="fake")))
    try:
        served.wait_ready(30)
        with socket.create_connection(("127.0.0.1", served.sock.getsockname()[1]), timeout=30) as connection:
            connection.sendall(sent)
            try:
                for _ in range(300):  # a header byte every 0.1 s, for 60 times the time allowed
                    connection.sendall(b"X")
                    time.sleep(0.1)
            except (BrokenPipeError, ConnectionResetError):
                pass
            try:
                answer = connection.recv(65536)
            except ConnectionResetError:
                answer = b""
        assert answer == b""
        with socket.create_connection(("127.0.0.1", served.sock.getsockname()[1]), timeout=30) as connection:
            connection.sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")  # a whole head, then a slow reader
            time.sleep(1)
            connection.sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            answer = b""
            while chunk := connection.recv(65536):
                answer += chunk
        assert answer.count(b"HTTP/1.1 200") == 2, answer[:300]
    finally:
        served.stop()


def test_a_body_that_does_not_come_whole_in_time_gets_a_408_and_its_connection_closed(monkeypatch):
    """A client that declares a body and sends it a byte at a time held its connection
    (and the body read so far) forever."""
    from edgespec.server import api

    monkeypatch.setattr(api, "BODY_TIMEOUT_S", 0.5)
    served = ServerThread(create_app(FakeEngine, ServerSettings(model_id="fake")))
    try:
        served.wait_ready(30)
        with socket.create_connection(("127.0.0.1", served.sock.getsockname()[1]), timeout=30) as connection:
            connection.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                               b"Content-Length: 1000\r\n\r\n{")
            try:
                for _ in range(300):  # a byte every 0.1 s, for 60 times the time allowed
                    connection.sendall(b" ")
                    time.sleep(0.1)
            except (BrokenPipeError, ConnectionResetError):
                pass
            answer = b""
            try:  # the bytes sent after the answer reset the connection: the answer is read before
                while chunk := connection.recv(65536):
                    answer += chunk
            except ConnectionResetError:
                pass
        status, _, rest = answer.partition(b"\r\n")
        assert status.split()[1] == b"408", answer[:200]
        assert json.loads(rest.partition(b"\r\n\r\n")[2])["error"]["code"] == "request_timeout"
        assert http("POST", served.url + "/v1/completions", completion_body(max_tokens=2))[0] == 200
    finally:
        served.stop()


def test_a_streaming_client_that_stops_reading_is_dropped_and_its_reply_cancelled(monkeypatch, caplog, capfd):
    """A client that sends a streamed request and never reads its reply held its connection
    forever (the server's writes wait for room in a full TCP window), and the engine wrote
    the whole reply to nobody while every other request waited."""
    from edgespec.server import listen

    monkeypatch.setattr(listen, "SEND_TIMEOUT_S", 0.5)
    caplog.set_level(logging.INFO, logger="edgespec.server")
    engine = FakeEngine(reply=lambda _: "x" * 4000, delay_s=0.005)  # 20 s of reply, 200 events a second
    server = ServerThread(create_app(lambda: engine, ServerSettings(model_id="fake")))
    # The connection's buffers small at both ends (the server's is its listening socket's), so that
    # kilobytes unread fill them, not the megabytes that loopback's grow to.
    server.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    try:
        server.wait_ready(30)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as stuck:
            stuck.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1024)  # before connecting, as the window's scale
            stuck.connect(("127.0.0.1", server.sock.getsockname()[1]))
            body = json.dumps({"prompt": "hi", "stream": True}).encode()
            stuck.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                          b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
            assert until(lambda: engine.prompts and not engine.generating, 10), "the reply went on to nobody"
            assert engine.cache.count(ord("x")) < 4000  # cut short, not written to the end
            status, answer = http("POST", server.url + "/v1/completions", completion_body(max_tokens=2))
            assert status == 200 and answer["choices"][0]["text"] == "xx"
        dropped = [r for r in caplog.records if "did not read" in r.getMessage()]
        assert len(dropped) == 1 and dropped[0].exc_info is None, caplog.text
        err = capfd.readouterr().err  # uvicorn's log
        assert "Traceback" not in err and "ASGI" not in err, err
    finally:
        server.stop()


def test_a_model_that_fails_to_load_stops_the_server_with_its_error():
    def load():
        raise ModelFileError("no such model file: x.gguf")

    app = create_app(load, ServerSettings(model_id="x"))
    with pytest.raises(ModelFileError, match="x.gguf"):
        run(app, bind("127.0.0.1", 0))


def test_after_a_lost_worker_the_next_request_loads_the_model_again():
    """A worker lost mid-reply leaves the engine unusable: that request fails
    with 503 naming the worker, and each later request loads the model again
    (503 while the worker is still away), so the server needs no restart."""
    lost = WorkerLostError("lost the RPC worker at 127.0.0.1:50052 (connection closed)")
    worker_up = threading.Event()
    engines = []

    class LosingEngine(FakeEngine):
        def generate(self, prompt_tokens, params, *, regions=()):
            for i, chunk in enumerate(super().generate(prompt_tokens, params, regions=regions)):
                if i == 2 and len(engines) == 1:
                    raise lost
                yield chunk

    def load():
        if engines and not worker_up.is_set():
            raise WorkerUnreachableError("cannot reach the RPC worker at 127.0.0.1:50052 (Connection refused). "
                                         "Start one there, or check the address.")
        engines.append(LosingEngine())
        return engines[-1]

    served = ServerThread(create_app(load, ServerSettings(model_id="fake")))
    complete = json.dumps({"prompt": "hi", "max_tokens": 5}).encode()
    try:
        served.wait_ready(30)
        status, body = http("POST", served.url + "/v1/completions", complete)
        assert status == 503 and body["error"]["code"] == "worker_lost"
        assert body["error"]["message"] == ("lost the RPC worker at 127.0.0.1:50052 (connection closed). "
                                            "Start it again: the next request loads the model again.")
        assert engines[0].closed
        status, body = http("GET", served.url + "/health")
        assert status == 503 and body["error"]["code"] == "worker_lost"
        status, body = http("POST", served.url + "/v1/completions", complete)  # the worker is still away
        assert status == 503 and "cannot reach the RPC worker" in body["error"]["message"]
        assert body["error"]["code"] == "worker_lost" and not body["error"]["message"].endswith("..")
        worker_up.set()
        status, body = http("POST", served.url + "/v1/completions", complete)
        assert status == 200 and body["choices"][0]["text"] == "reply"
        assert len(engines) == 2 and http("GET", served.url + "/health")[0] == 200
    finally:
        served.stop()
    assert engines[1].closed


def test_a_client_gone_while_its_long_prompt_is_read_frees_the_engine_between_batches():
    engine = SlowReader(batches=100)  # 5 s of reading
    served = ServerThread(create_app(lambda: engine, ServerSettings(model_id="fake")))
    try:
        served.wait_ready(30)
        connection = http_client.HTTPConnection("127.0.0.1", int(served.url.rsplit(":", 1)[1]), timeout=30)
        connection.request("POST", "/v1/completions", json.dumps({"prompt": "a long file", "max_tokens": 5}),
                           {"Content-Type": "application/json"})
        assert engine.reading.wait(30)
        connection.close()
        assert engine.ended.wait(30)
        assert engine.batches_read[0] < engine.batches, engine.batches_read  # stopped, not read to the end
        assert engine.interrupts == 1  # and the engine was told mid-batch (a real batch takes seconds)
    finally:
        served.stop()


def until(condition, timeout_s: float = 10.0) -> bool:
    """Whether `condition()` holds within `timeout_s` (checked every 10 ms)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def completion_body(**fields) -> bytes:
    return json.dumps({"prompt": "hi", "max_tokens": 5, **fields}).encode()


@pytest.mark.parametrize("prompt", [[104, 105], [[104, 105]], ["hi"]])
def test_a_prompt_may_be_token_ids_or_a_list_of_one_prompt(prompt):
    """OpenAI's API takes a prompt as a text, token ids, or a list of either: a list
    holding one list of ids was refused ("prompt.0: Input should be a valid string")."""
    engine = FakeEngine()
    served = ServerThread(create_app(lambda: engine, ServerSettings(model_id="fake")))
    try:
        served.wait_ready(30)
        status, answer = http("POST", served.url + "/v1/completions", completion_body(prompt=prompt, max_tokens=2))
        assert status == 200, answer
        assert engine.prompts[-1][-2:] == [104, 105]
    finally:
        served.stop()


@pytest.mark.parametrize("prompt, param, words", [
    ([[104], [105]], "prompt", "2 prompts"),
    (["hi", "ho"], "prompt", "2 prompts"),
    ([[]], "prompt", "empty"),
    ([1.5], "prompt.0", "integer"),
    ([[104, "a"]], "prompt.1", "integer"),
])
def test_a_prompt_that_is_not_one_text_or_token_ids_says_what_it_is(prompt, param, words):
    served = ServerThread(create_app(FakeEngine, ServerSettings(model_id="fake")))
    try:
        served.wait_ready(30)
        status, answer = http("POST", served.url + "/v1/completions", completion_body(prompt=prompt))
        assert status == 400 and answer["error"]["param"] == param, answer
        assert words in answer["error"]["message"]
    finally:
        served.stop()


def test_an_idle_server_reads_the_conversation_with_its_last_reply_ahead_in_that_replys_mode():
    """An editor's or agent's next request comes seconds after a reply (a person reads it,
    a tool runs) and starts with the prompt and that reply: the server reads them into
    the models meanwhile (Engine.read, as the chat does after each reply), in the reply's
    mode (whether a draft model reads them), once."""
    engine = FakeEngine()
    served = ServerThread(create_app(lambda: engine, ServerSettings(model_id="fake")))
    try:
        served.wait_ready(30)
        status, body = http("POST", served.url + "/v1/completions",
                            completion_body(max_tokens=20, speculation={"mode": "draft", "k": 3}))
        assert status == 200
        assert until(lambda: engine.reads)
        tokens, params = engine.reads[0]
        assert tokens == engine.prompts[0] + engine.tokenize(body["choices"][0]["text"], special=False)
        assert (params.mode, params.k) == ("draft", 3)
        status, body = http("POST", served.url + "/v1/completions", completion_body(prompt=[5, 6, 7]))
        assert status == 200 and until(lambda: len(engine.reads) == 2)
        assert engine.reads[1][0] == [5, 6, 7, *engine.tokenize(body["choices"][0]["text"])]  # token ids, as sent
        time.sleep(0.2)
        assert len(engine.reads) == 2  # once a reply
    finally:
        served.stop()


def test_a_reply_that_filled_the_context_is_not_read_ahead(caplog):
    """The next request cannot start with a conversation that fills the context: there
    is nothing to read ahead, and no failure to log for it."""
    caplog.set_level(logging.INFO, logger="edgespec.server")

    class Bounded(FakeEngine):
        def read(self, prompt_tokens, params):
            if len(prompt_tokens) >= self.n_ctx:
                raise ContextFullError(f"{len(prompt_tokens)} tokens do not fit in {self.n_ctx}")
            yield from super().read(prompt_tokens, params)

    engine = Bounded(n_ctx=8, reply=lambda prompt: "abcde")  # 3 prompt tokens, 5 replied: 8
    served = ServerThread(create_app(lambda: engine, ServerSettings(model_id="fake")))
    try:
        served.wait_ready(30)
        status, body = http("POST", served.url + "/v1/completions", completion_body(max_tokens=10))
        assert status == 200 and body["choices"][0]["text"] == "abcde"
        assert http("POST", served.url + "/v1/completions", completion_body(prompt="a", max_tokens=2))[0] == 200
        assert until(lambda: len(engine.reads) == 1)  # the second reply, which fits, is read ahead
        assert len(engine.reads[0][0]) < 8
        assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text
    finally:
        served.stop()


class SlowAhead(FakeEngine):
    """Reads ahead for 200 batches of 50 ms; interrupt() ends the reading at its next
    batch. As the engine's, a reading forgets an interrupt that came before it."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.reading = threading.Event()
        self.batches_read: list[int] = []
        self._stop = threading.Event()

    def interrupt(self) -> None:
        super().interrupt()
        self._stop.set()

    def read(self, prompt_tokens, params):
        self._stop.clear()
        read = 0
        try:
            for read in range(1, 201):
                if self._stop.is_set():
                    return
                self.reading.set()
                time.sleep(0.05)
                yield Chunk("", stats=Stats(prompt_tokens=len(prompt_tokens), prompt_evaluated=read))
            yield from super().read(prompt_tokens, params)
        finally:
            self.batches_read.append(read)


def test_a_request_that_comes_while_the_server_reads_ahead_stops_the_reading():
    """Reading ahead is what the server does with its idle time: the next request does
    not wait for it (10 s here), and the reading after that request's reply goes on
    until the server stops, which stops it too."""
    engine = SlowAhead()
    served = ServerThread(create_app(lambda: engine, ServerSettings(model_id="fake")))
    try:
        served.wait_ready(30)
        assert http("POST", served.url + "/v1/completions", completion_body())[0] == 200
        assert engine.reading.wait(30)
        engine.reading.clear()
        status, body = http("POST", served.url + "/v1/completions", completion_body(prompt="again"))
        assert status == 200 and body["choices"][0]["text"] == "reply"
        assert engine.batches_read[:1] and engine.batches_read[0] < 200 and len(engine.prompts) == 2
        assert engine.reading.wait(30)
        time.sleep(0.2)  # what stopped the first reading must not stop this one
        assert len(engine.batches_read) == 1, engine.batches_read
    finally:
        served.stop()
    assert len(engine.batches_read) == 2 and engine.batches_read[1] < 200 and engine.closed


@pytest.mark.parametrize("fatal", [True, False])
def test_a_reading_ahead_that_fails_is_told_at_the_next_request_only_where_it_lost_the_engine(fatal):
    """A worker lost while the server reads ahead leaves the engine unusable, as one lost
    mid-reply: /health says so and the next request loads the model again. Any other
    failure of a reading that nobody asked for is logged, and the server goes on."""
    error = WorkerLostError("lost the RPC worker at 127.0.0.1:50052 (connection closed)") if fatal \
        else RuntimeError("the draft model's cache is full")
    engines = []

    class FailingReader(FakeEngine):
        def read(self, prompt_tokens, params):
            if self is engines[0]:
                raise error
            yield from super().read(prompt_tokens, params)

    def load():
        engines.append(FailingReader())
        return engines[-1]

    served = ServerThread(create_app(load, ServerSettings(model_id="fake")))
    try:
        served.wait_ready(30)
        assert http("POST", served.url + "/v1/completions", completion_body())[0] == 200
        if fatal:
            assert until(lambda: engines[0].closed)
            status, body = http("GET", served.url + "/health")
            assert status == 503 and body["error"]["code"] == "worker_lost"
        status, body = http("POST", served.url + "/v1/completions", completion_body())
        assert status == 200 and body["choices"][0]["text"] == "reply"
        assert len(engines) == (2 if fatal else 1) and http("GET", served.url + "/health")[0] == 200
    finally:
        served.stop()


def test_the_draft_model_holds_the_conversation_with_the_reply_before_the_next_request(synth_target,
                                                                                   synth_near_draft):
    """The real engine (synthetic models): once a reply in draft mode is out, both models
    read it and the target its last token, all before the next request comes."""
    def settings(path):
        return ModelSettings(path, n_ctx=256, n_threads=1, n_batch=64)

    engine = Engine.load(settings(synth_target), settings(synth_near_draft))
    served = ServerThread(create_app(lambda: engine, ServerSettings(model_id="synthetic")))
    try:
        served.wait_ready(30)
        prompt = [1, *range(FIRST_WORD + 30, FIRST_WORD + 58)]
        status, body = http("POST", served.url + "/v1/completions",
                            completion_body(prompt=prompt, max_tokens=10, speculation={"mode": "draft", "k": 4}))
        assert status == 200
        n = len(prompt) + body["usage"]["completion_tokens"]
        assert until(lambda: len(engine.draft_seq.tokens) == n)
        assert engine.draft_seq.tokens == engine.target_seq.tokens and engine.target_seq.tokens[:len(prompt)] == prompt
    finally:
        served.stop()


def test_a_suffix_reaches_a_real_model_between_its_fim_tokens_as_plain_text(synth_target, tmp_path):
    """llama.cpp names the FIM tokens from the GGUF's metadata; the prompt and suffix
    are tokenized by the model's own tokenizer without parsing special texts."""
    with Engine.load(ModelSettings(synth_target, n_ctx=256, n_threads=1)) as plain:
        assert plain.fim_tokens is None
    engine = Engine.load(ModelSettings(write_model(tmp_path / "fim.gguf", seed=1, fim=True),
                                       n_ctx=256, n_threads=1, n_batch=64))
    pre, suf, mid = engine.fim_tokens
    assert [engine.token_text(t) for t in (pre, suf, mid)] == SYNTHETIC_FIM
    server = ServerThread(create_app(lambda: engine, ServerSettings(model_id="synthetic")))
    try:
        server.wait_ready(30)
        before, after = "a <|fim_middle|>", " b"
        status, body = http("POST", server.url + "/v1/completions",
                            completion_body(prompt=before, suffix=after, max_tokens=2))
        assert status == 200, body
        text = lambda t: engine.tokenize(t, special=False)  # noqa: E731
        prompt = [engine.bos, pre, *text(before), suf, *text(after), mid]
        assert engine.target_seq.tokens[:len(prompt)] == prompt and mid not in text(before)
    finally:
        server.stop()


def test_token_ids_outside_the_vocabulary_are_refused_and_never_kept(synth_target, tmp_path):
    """A token-id prompt with an id the model does not have gets a 400 naming the prompt
    (llama_decode failed on it: a 500 with a traceback), the engine refuses it before
    reading anything, and the lookup pool never keeps it (an earlier version saved it,
    to be proposed as a draft later)."""
    from edgespec.engine.runtime import CacheSettings
    from edgespec.errors import InvalidTokenError

    engine = Engine.load(ModelSettings(synth_target, n_ctx=256, n_threads=1, n_batch=64),
                         cache=CacheSettings(pool=tmp_path / "pool"))
    n_vocab = engine.target_seq.ctx.n_vocab
    for bad in (n_vocab, -1):
        with pytest.raises(InvalidTokenError, match="vocabulary"):
            engine.generate([1, FIRST_WORD, bad], GenerationParams(max_tokens=2))
        with pytest.raises(InvalidTokenError, match="vocabulary"):
            engine.read([1, bad], GenerationParams(max_tokens=2))
    served = ServerThread(create_app(lambda: engine, ServerSettings(model_id="synthetic")))
    try:
        served.wait_ready(30)
        for prompt in ([1, FIRST_WORD, n_vocab], [[1, FIRST_WORD, n_vocab]]):
            status, body = http("POST", served.url + "/v1/completions", completion_body(prompt=prompt, max_tokens=2))
            assert status == 400 and body["error"]["param"] == "prompt", body
            assert str(n_vocab) in body["error"]["message"]
        status, body = http("POST", served.url + "/v1/completions",
                            completion_body(prompt=[1, FIRST_WORD, FIRST_WORD + 1], max_tokens=2))
        assert status == 200, body
    finally:
        served.stop()
    (pool,) = (tmp_path / "pool").glob("*.pool")
    assert n_vocab.to_bytes(4, "little") not in pool.read_bytes()


# -- SmolLM2 behind the server -------------------------------------------------------------------

@pytest.fixture(scope="module", name="served")
def served_fixture(smollm2):
    settings = ServerSettings(model_id=MODEL, api_key=KEY)
    # Exact kernels: the served reply (auto mode) must be plain greedy decoding's, token for token.
    server = ServerThread(create_app(lambda: Engine.load(ModelSettings(smollm2, n_ctx=CTX, exact=True)), settings))
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()


@pytest.fixture(name="client")
def client_fixture(served):
    return openai.OpenAI(base_url=served.url + "/v1", api_key=KEY, max_retries=0, timeout=120)


@pytest.mark.slow
def test_chat_whole_and_streamed_are_the_same_reply_with_usage_and_statistics(client):
    whole = client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=10)
    text = whole.choices[0].message.content
    assert text and whole.choices[0].finish_reason in ("stop", "length")
    usage = whole.usage
    assert usage.completion_tokens <= 10 and usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    timings = whole.model_extra["timings"]
    assert timings["predicted_n"] == usage.completion_tokens and timings["mode"] == "auto"
    assert timings["prompt_n"] + timings["cache_n"] == usage.prompt_tokens
    assert {"draft_n", "draft_n_accepted", "acceptance_rate", "tokens_per_pass", "drafter",
            "predicted_per_second"} <= timings.keys()

    chunks = list(client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=10, stream=True,
                                                 stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == whole.choices[0].finish_reason
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == usage.completion_tokens
    assert len({c.id for c in chunks}) == 1


@pytest.mark.slow
def test_text_completions_and_models(client):
    whole = client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=5)
    streamed = client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=5, stream=True)
    assert "".join(c.choices[0].text for c in streamed) == whole.choices[0].text != ""
    assert whole.usage.completion_tokens <= 5
    assert [m.id for m in client.models.list()] == [MODEL]
    with pytest.raises(openai.NotFoundError) as e:
        client.chat.completions.create(model="gpt-4o", messages=QUESTION, max_tokens=2)
    assert e.value.code == "model_not_found"


@pytest.mark.slow
def test_greedy_reply_is_the_engines_own_for_the_same_prompt(client, smollm2):
    reply = client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=12).choices[0].message.content
    with Engine.load(ModelSettings(smollm2, n_ctx=CTX, exact=True)) as engine:
        tokens = engine.tokenize(chat_template(engine).render(QUESTION), special=True)
        direct = "".join(c.text for c in engine.generate(tokens, GenerationParams(mode="plain", max_tokens=12)))
    assert reply == direct


@pytest.mark.slow
def test_stop_strings_end_the_reply_before_them(client):
    full = client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=12).choices[0]
    words = full.message.content.split()
    assert len(words) >= 3, full.message.content
    stop = words[2]
    cut = client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=12, stop=[stop, "zzz"]).choices[0]
    assert cut.finish_reason == "stop"
    assert cut.message.content == full.message.content[:full.message.content.index(stop)]


@pytest.mark.slow
def test_a_seed_makes_a_sampled_reply_reproducible(client):
    def sample(seed):
        r = client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=10, temperature=1.0, seed=seed)
        return r.choices[0].message.content, r.model_extra["timings"]["mode"]

    first, mode = sample(7)
    assert sample(7) == (first, mode) and mode == "plain"  # auto's choices would make it depend on timing
    assert {sample(8)[0], sample(9)[0]} != {first}


@pytest.mark.slow
def test_a_resent_conversation_pays_only_for_the_new_message(client):
    history = [{"role": "user", "content": "Hello! Who are you?"}]
    first = client.chat.completions.create(model=MODEL, messages=history, max_tokens=8)
    history += [{"role": "assistant", "content": first.choices[0].message.content},
                {"role": "user", "content": "And what can you do?"}]
    second = client.chat.completions.create(model=MODEL, messages=history, max_tokens=8)
    cached = second.model_extra["timings"]["cache_n"]
    assert cached >= first.usage.total_tokens - 1  # all of turn 1 (its closing token is re-read)
    assert second.model_extra["timings"]["prompt_n"] <= second.usage.prompt_tokens - cached


@pytest.mark.slow
def test_a_client_that_closes_its_stream_frees_the_engine_at_once(client, caplog):
    caplog.set_level(logging.INFO, logger="edgespec.server")
    stream = client.completions.create(model=MODEL, prompt="1, 2, 3, 4, 5, 6, 7, 8,", max_tokens=900, stream=True)
    for _, _chunk in zip(range(3), stream):
        pass
    stream.close()
    after = client.completions.create(model=MODEL, prompt="Hello", max_tokens=1)
    assert after.usage.completion_tokens == 1
    cancelled = [r.getMessage() for r in caplog.records if "ended: cancelled" in r.getMessage()]
    assert len(cancelled) == 1, [r.getMessage() for r in caplog.records]


@pytest.mark.slow
def test_a_client_that_gives_up_waiting_for_a_whole_reply_frees_the_engine(served, client, caplog):
    caplog.set_level(logging.INFO, logger="edgespec.server")
    connection = http_client.HTTPConnection("127.0.0.1", int(served.url.rsplit(":", 1)[1]), timeout=30)
    connection.request("POST", "/v1/completions", json.dumps({"prompt": "1, 2, 3, 4,", "max_tokens": 900}),
                       {"Content-Type": "application/json", "Authorization": f"Bearer {KEY}"})
    deadline = time.monotonic() + 30  # wait for the server to start on it: a close before that is no test
    while not any(r.getMessage().endswith(": started") for r in caplog.records) and time.monotonic() < deadline:
        time.sleep(0.02)
    connection.close()
    after = client.completions.create(model=MODEL, prompt="Hello", max_tokens=1)
    assert after.usage.completion_tokens == 1
    cancelled = [r.getMessage() for r in caplog.records if "ended: cancelled" in r.getMessage()]
    assert len(cancelled) == 1, [r.getMessage() for r in caplog.records]


@pytest.mark.slow
def test_eight_concurrent_clients_are_answered_in_full_and_unmixed(client):
    prompts = [f"My favourite number is {n}. Twice {n} is" for n in range(8)]

    def ask(i):
        if i % 2:
            chunks = list(client.completions.create(model=MODEL, prompt=prompts[i], max_tokens=4, stream=True,
                                                    stream_options={"include_usage": True}))
            text = "".join(c.choices[0].text for c in chunks if c.choices)
            return text, chunks[-1].usage.prompt_tokens, len({c.id for c in chunks})
        r = client.completions.create(model=MODEL, prompt=prompts[i], max_tokens=4)
        return r.choices[0].text, r.usage.prompt_tokens, 1

    with ThreadPoolExecutor(8) as pool:
        together = list(pool.map(ask, range(8)))
    alone = [ask(i) for i in range(8)]
    assert together == alone


@pytest.mark.slow
def test_bad_requests_get_openai_errors_and_the_server_goes_on(served, client):
    chat = served.url + "/v1/chat/completions"
    status, body = http("POST", chat, b'{"messages": [')
    assert status == 400 and body["error"]["type"] == "invalid_request_error" and "JSON" in body["error"]["message"]
    status, body = http("POST", chat, json.dumps({"messages": QUESTION, "temperature": "hot"}).encode())
    assert status == 400 and body["error"]["param"] == "temperature"
    status, body = http("POST", chat, json.dumps({"messages": "hi"}).encode())
    assert status == 400 and body["error"]["param"].startswith("messages")
    status, body = http("POST", chat, json.dumps({"messages": QUESTION, "n": 2}).encode())
    assert status == 400 and "n=2" in body["error"]["message"]
    status, body = http("POST", chat, json.dumps({"messages": QUESTION, "tools": [{"type": "function"}]}).encode())
    assert status == 400 and "tools" in body["error"]["message"]
    status, body = http("POST", chat, b'{"messages": "' + b"x" * (10 * 1024 * 1024) + b'"}')
    assert status == 413 and body["error"]["message"]
    status, body = http("POST", chat, json.dumps({"messages": QUESTION}).encode(), key="wrong")
    assert status == 401 and body["error"]["code"] == "invalid_api_key"
    assert http("GET", served.url + "/v1/models", key=None)[0] == 401

    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL, max_tokens=2,
                                       messages=[{"role": "user", "content": "word " * (CTX + 100)}])
    assert e.value.code == "context_length_exceeded"
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=served.url + "/v1", api_key="wrong", max_retries=0).models.list()

    ok = client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=2)
    assert ok.choices[0].message.content


@pytest.mark.slow
@pytest.mark.parametrize("slots, source", [(2, "sequence"), (1, "ram")])
def test_coming_back_to_a_conversation_reads_only_its_new_message(smollm2, slots, source):
    """A, B, then A with one more turn: A's tokens come from its own sequence of the
    KV cache (two held at once), or from its snapshot in RAM (one held, B evicted it)."""
    from edgespec.engine.runtime import CacheSettings

    settings = ServerSettings(model_id=MODEL, api_key=KEY)
    server = ServerThread(create_app(lambda: Engine.load(
        ModelSettings(smollm2, n_ctx=2048), cache=CacheSettings(slots=slots, ram_mib=64)), settings))
    try:
        server.wait_ready()
        client = openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0, timeout=120)
        notes = {name: " ".join(f"Note {i} on {name}: it matters for reason {i}." for i in range(40))
                 for name in ("apples", "rivers")}
        chats = {name: [{"role": "user", "content": f"{text}\nSummarise the notes on {name}."}]
                 for name, text in notes.items()}
        for name in ("apples", "rivers"):
            reply = client.chat.completions.create(model=MODEL, messages=chats[name], max_tokens=8)
            chats[name].append({"role": "assistant", "content": reply.choices[0].message.content})
            assert reply.model_extra["timings"]["cache_n"] < 32  # nothing of it was held before
        chats["apples"].append({"role": "user", "content": "Shorter, please."})
        again = client.chat.completions.create(model=MODEL, messages=chats["apples"], max_tokens=8)
        timings = again.model_extra["timings"]
        assert timings["cache_from"] == source
        assert timings["prompt_n"] < 20 and timings["cache_n"] > 400  # the new message only
        assert timings["prompt_n"] + timings["cache_n"] == again.usage.prompt_tokens
    finally:
        server.stop()


def test_a_client_gone_before_its_stream_began_frees_the_engine():
    """A client that went away after its reply's first tokens came but before the
    stream's first event was sent: the events' generator never began, so its cleanup
    never cancelled the job, and the engine wrote the whole reply to nobody while
    every other request waited."""
    import asyncio

    hold = threading.Event()
    engine = FakeEngine(hold=hold, hold_after=2)
    app = create_app(lambda: engine, ServerSettings(model_id="fake"))
    body = completion_body(stream=True, max_tokens=50)
    calls = 0
    seen = {}

    async def receive():
        nonlocal calls
        calls += 1
        if calls == 1:  # the request
            return {"type": "http.request", "body": body, "more_body": False}
        if calls == 2:  # the wait for the first tokens: the client is still there
            await asyncio.Event().wait()
        return {"type": "http.disconnect"}  # the stream's own watch: gone

    async def send(message):
        if message["type"] == "http.response.start":
            seen.update(status=message["status"], interrupts=engine.interrupts)  # its first tokens came
            for _ in range(10):  # the stream's other tasks run first: its disconnect watch sees the client gone
                await asyncio.sleep(0)

    async def request():
        async with app.router.lifespan_context(app):
            await asyncio.to_thread(app.state.engine_thread.wait_loaded, 30)
            scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
                     "scheme": "http", "path": "/v1/completions", "raw_path": b"/v1/completions",
                     "query_string": b"", "root_path": "", "server": ("127.0.0.1", 80), "client": ("127.0.0.1", 1),
                     "headers": [(b"content-type", b"application/json")]}
            await app(scope, receive, send)
            interrupted = engine.interrupts > seen["interrupts"]
            hold.set()
            return interrupted

    try:
        assert asyncio.run(request()) and seen["status"] == 200
    finally:
        hold.set()


class CachingEngine(FakeEngine):
    """Says, as the real engine does, how much of each prompt its cache held."""

    def generate(self, prompt_tokens, params, *, regions=()):
        held = common_prefix_length(self.cache, prompt_tokens)
        for chunk in super().generate(prompt_tokens, params, regions=regions):
            chunk.stats.prompt_cached = held
            yield chunk


def test_usage_says_how_many_prompt_tokens_came_from_the_cache():
    """OpenAI's usage.prompt_tokens_details.cached_tokens (llama-server's too), which clients
    read to show what the cache saved: it was missing, so a resent conversation read as
    paid for in full."""
    served = ServerThread(create_app(CachingEngine, ServerSettings(model_id="fake", template="chatml")))
    try:
        served.wait_ready(30)
        status, first = http("POST", served.url + "/v1/chat/completions",
                             json.dumps({"messages": QUESTION, "max_tokens": 3}).encode())
        assert status == 200 and first["usage"]["prompt_tokens_details"]["cached_tokens"] == 0, first
        again = [*QUESTION, first["choices"][0]["message"], {"role": "user", "content": "More."}]
        status, second = http("POST", served.url + "/v1/chat/completions",
                              json.dumps({"messages": again, "max_tokens": 3}).encode())
        cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
        assert status == 200 and 0 < cached == second["timings"]["cache_n"] < second["usage"]["prompt_tokens"]
    finally:
        served.stop()


def test_a_stop_notice_after_the_server_stopped_is_nothing():
    """A signal that comes once the server's loop has closed (a late second Ctrl+C) must not
    raise from the signal handler."""
    import asyncio

    from edgespec.server.api import StopNotice

    notice = StopNotice()

    async def start():
        notice.start()

    asyncio.run(start())  # the loop closes when run() returns
    notice.set()

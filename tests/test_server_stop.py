"""Stopping `edgespec serve` as a user does, with Ctrl+C or SIGTERM, at any moment:
while it starts, while it loads, idle, and in the middle of a streamed reply."""

from __future__ import annotations

import http.client
import json
import select
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

pytest.importorskip("fastapi")

ROOT = Path(__file__).resolve().parents[1]

FAKE_SERVER = textwrap.dedent("""
    import sys
    sys.path.insert(0, {root!r})
    from tests.fakes import FakeEngine
    from edgespec.server import ServerSettings, bind, create_app, run, url

    app = create_app(lambda: FakeEngine(reply=lambda prompt: "x" * 100_000, delay_s=0.005),
                     ServerSettings(model_id="fake"))
    sock = bind("127.0.0.1", 0)
    print(url(sock), flush=True)
    run(app, sock, on_ready=lambda: print("ready", flush=True))
    print("stopped", flush=True)
""")


GATED_SERVER = textwrap.dedent("""
    import sys, urllib.error, urllib.request
    sys.path.insert(0, {root!r})
    from tests.fakes import FakeEngine
    from edgespec.server import ServerSettings, bind, create_app, run, url

    def load():
        sys.stdin.readline()  # loading ends when the test says so
        return FakeEngine()

    def health():
        try:
            return urllib.request.urlopen(address + "/health", timeout=30).status
        except urllib.error.HTTPError as e:
            return e.code

    app = create_app(load, ServerSettings(model_id="fake"))
    sock = bind("127.0.0.1", 0)
    address = url(sock)
    print(address, flush=True)
    run(app, sock, on_ready=lambda: print("ready", health(), flush=True))
""")


def _as_started_from_a_terminal() -> None:
    """A child's Ctrl+C as a terminal gives it: a suite started in the background
    (`pytest &`) has SIGINT ignored, which its children would inherit, and Python
    then leaves it ignored until uvicorn installs its own handler."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _line(stream, timeout: float = 60) -> str:
    """The next line of a child's pipe, or '' at its end or after `timeout`."""
    ready, _, _ = select.select([stream], [], [], timeout)
    return stream.readline() if ready else ""


def _wait_for(stream, word: str, timeout: float = 120) -> list[str]:
    lines = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = _line(stream, deadline - time.monotonic())
        if not line:
            break
        lines.append(line)
        if word in line:
            return lines
    raise AssertionError(f"no {word!r} in {''.join(lines)!r}")


def _ready_at(server: subprocess.Popen) -> tuple[str, int]:
    """The host and port of a FAKE_SERVER child, once it says it is ready."""
    address = _line(server.stdout).strip()
    _wait_for(server.stdout, "ready")
    host, port = address.removeprefix("http://").rsplit(":", 1)
    return host, int(port)


def _stopped_cleanly(server: subprocess.Popen, *unsaid: str) -> None:
    """The child exited 0 having said "stopped", with no traceback and none of `unsaid` in its log."""
    assert server.wait(timeout=30) == 0
    out, err = server.communicate(timeout=30)
    assert "stopped" in out
    assert not [words for words in ("Traceback", *unsaid) if words in err], err


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_server_stopped_mid_stream_ends_the_stream_with_an_error_and_done(sig):
    server = subprocess.Popen([sys.executable, "-c", FAKE_SERVER.format(root=str(ROOT))], cwd=ROOT, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    try:
        host, port = _ready_at(server)
        connection = http.client.HTTPConnection(host, port, timeout=60)
        connection.request("POST", "/v1/completions", json.dumps({"prompt": "hi", "stream": True}),
                           {"Content-Type": "application/json"})
        response = connection.getresponse()
        assert response.status == 200
        events = []
        while not any('"text":"x' in e for e in events):  # the reply is streaming
            line = response.readline().decode()
            assert line, "the stream ended before its first token"
            if line.startswith("data: "):
                events.append(line[6:].strip())
        server.send_signal(sig)
        while line := response.readline().decode():  # to the stream's end
            if line.startswith("data: "):
                events.append(line[6:].strip())
        connection.close()
        assert events[-1] == "[DONE]", events[-3:]
        assert json.loads(events[-2])["error"]["code"] == "server_stopping"
        _stopped_cleanly(server, "without completing response")
    finally:
        server.kill()
        server.wait()


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_server_stopped_before_a_reply_is_whole_answers_it_with_a_503(sig):
    """A request not streamed (its reply is not whole yet) and a streamed one waiting
    behind it for the engine: told to stop, the server answers both with OpenAI's error
    body (they got a plain-text 500 after the graceful stop ran out, and a traceback
    each in the log)."""
    server = subprocess.Popen([sys.executable, "-c", FAKE_SERVER.format(root=str(ROOT))], cwd=ROOT, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    try:
        host, port = _ready_at(server)
        whole, queued = (http.client.HTTPConnection(host, port, timeout=60) for _ in range(2))
        whole.request("POST", "/v1/completions", json.dumps({"prompt": "hi"}), {"Content-Type": "application/json"})
        time.sleep(0.5)
        queued.request("POST", "/v1/completions", json.dumps({"prompt": "hi", "stream": True}),
                       {"Content-Type": "application/json"})
        time.sleep(0.5)
        server.send_signal(sig)
        for connection in (whole, queued):
            response = connection.getresponse()
            body = response.read().decode()
            assert (response.status, response.getheader("content-type")) == (503, "application/json"), body
            assert json.loads(body)["error"]["code"] == "server_stopping", body
            connection.close()
        _stopped_cleanly(server, "Exception in ASGI")
    finally:
        server.kill()
        server.wait()


def test_serve_says_ready_once_health_answers_200_and_not_while_it_loads():
    server = subprocess.Popen([sys.executable, "-c", GATED_SERVER.format(root=str(ROOT))], cwd=ROOT, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.PIPE)
    try:
        address = _line(server.stdout).strip()
        deadline = time.monotonic() + 60
        while (status := _health(address)) != 503 and time.monotonic() < deadline:
            time.sleep(0.05)  # uvicorn is starting: no answer yet
        assert status == 503  # loading
        assert not select.select([server.stdout], [], [], 0)[0], "a line while loading"
        server.stdin.write("loaded\n")
        server.stdin.flush()
        assert _line(server.stdout).split() == ["ready", "200"]
        server.send_signal(signal.SIGINT)
        assert server.wait(timeout=30) == 0
    finally:
        server.kill()
        server.wait()


def _health(address: str) -> int:
    import urllib.error
    import urllib.request

    try:
        return urllib.request.urlopen(address + "/health", timeout=30).status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return 0


@pytest.mark.slow
@pytest.mark.parametrize("moment, delay_s, twice", [
    ("while it starts", 0.1, False),
    ("while it loads", None, False),
    ("just after it is ready", 0.0, False),
    ("idle", 0.5, False),
    ("twice, just after it is ready", 0.0, True),
    ("twice, idle", 0.3, True),
])
def test_ctrl_c_at_any_moment_stops_serve_with_no_traceback(smollm2, moment, delay_s, twice):
    server = subprocess.Popen([sys.executable, "-m", "edgespec", "serve", "--target", str(smollm2), "--no-draft",
                               "--port", "0"], cwd=ROOT, text=True, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                              preexec_fn=_as_started_from_a_terminal)
    try:
        if moment == "while it starts":
            time.sleep(delay_s)
        else:
            _wait_for(server.stderr, "loading" if moment == "while it loads" else "ready")
            time.sleep(delay_s or 0)
        server.send_signal(signal.SIGINT)
        if twice:
            time.sleep(0.05)
            server.send_signal(signal.SIGINT)
        _, err = server.communicate(timeout=60)
        assert server.returncode in (0, 130), err
        assert "Traceback" not in err, err
        assert "stopped" in err or "interrupted" in err, err
    finally:
        server.kill()
        server.wait()

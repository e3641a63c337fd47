"""Where the server listens, and running it until Ctrl+C.

Binds 127.0.0.1 unless told otherwise. Any other address can be reached from
other machines, so it needs an API key, or an explicit opt-out that is warned
about loudly.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import signal
import socket
import threading
from typing import Callable

from fastapi import FastAPI

from edgespec import net
from edgespec.errors import ServeError

log = logging.getLogger("edgespec.server")


def check_exposure(host: str, *, api_key: str | None, allow_no_key: bool) -> str | None:
    """ServeError for what is not a host at all, and for a non-loopback host without
    an API key (unless `allow_no_key`); the warning to show when it is allowed anyway."""
    try:
        return net.check_exposure(
            host, guarded=bool(api_key), allowed=allow_no_key,
            refusal=f"--host {host} can be reached from other machines: set an API key (--api-key KEY, or the "
                    f"EDGESPEC_API_KEY environment variable), or bind 127.0.0.1.",
            warning=f"WARNING: serving on {host} with NO API key: anyone who can reach this port can use the model "
                    f"(and this machine's CPU/GPU). Set --api-key unless this network is yours alone.")
    except ValueError as e:
        raise ServeError(str(e)) from None


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on host:port (port 0: any free port); ServeError if that fails."""
    try:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        return socket.create_server((host.strip("[]"), port), family=family, backlog=128)
    except OSError as e:
        hint = " (it is in use: pick another with --port)" if e.errno in (98, 48, 10048) else ""
        raise ServeError(f"cannot listen on {host}:{port}{hint}: {e.strerror or e}") from None


def url(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


GRACEFUL_S = 2
"""How long a stopping server waits for open requests to end before it cuts them."""


def run(app: FastAPI, sock: socket.socket, *, on_ready: Callable[[], None] | None = None,
        verbose: bool = False) -> None:
    """Serve `app` on `sock` until Ctrl+C (or SIGTERM). Calls `on_ready` once the
    model is loaded; if loading fails, stops and raises the loading error."""
    server = _server_class()(uvicorn_config(app, verbose=verbose))
    server.on_exit = app.state.stopping.set
    thread = app.state.engine_thread

    def watch_loading() -> None:
        thread.wait_loaded()
        if thread.error is not None:
            server.should_exit = True
        elif on_ready is not None:
            on_ready()

    threading.Thread(target=watch_loading, name="edgespec-ready", daemon=True).start()
    try:
        server.run(sockets=[sock])
    finally:
        sock.close()
    if thread.error is not None:
        raise thread.error


def uvicorn_config(app: FastAPI, *, verbose: bool = False):
    """How uvicorn serves the app: its log, the graceful stop, the request head's limit."""
    import uvicorn

    return uvicorn.Config(app, log_level="info" if verbose else "warning", access_log=verbose,
                          timeout_graceful_shutdown=GRACEFUL_S, lifespan="on", http=http_protocol(),
                          h11_max_incomplete_event_size=HEAD_BYTES)


def _server_class():
    import uvicorn
    from uvicorn.server import HANDLED_SIGNALS

    class Server(uvicorn.Server):
        """uvicorn's server for a program whose normal end is a signal: Ctrl+C or
        SIGTERM stops it, a second Ctrl+C cuts the open requests short, and the app
        (the engine) is closed either way. uvicorn raises the signals again once it
        has stopped, for its own command line; a second Ctrl+C then cancelled the
        app's shutdown mid-way, which was logged as a traceback. `on_exit` is told
        of each signal (the app's StopNotice)."""

        on_exit: Callable[[], None] | None = None

        def handle_exit(self, sig, frame) -> None:
            super().handle_exit(sig, frame)
            if self.on_exit is not None:
                self.on_exit()

        @contextlib.contextmanager
        def capture_signals(self):
            if threading.current_thread() is not threading.main_thread():
                yield
                return
            handlers = {sig: signal.signal(sig, self.handle_exit) for sig in HANDLED_SIGNALS}
            try:
                yield
            finally:
                for sig, handler in handlers.items():
                    signal.signal(sig, handler)

        async def shutdown(self, sockets=None) -> None:
            await super().shutdown(sockets)
            if self.force_exit:  # uvicorn then skips the app's shutdown
                await self.lifespan.shutdown()

    return Server


HEAD_BYTES = 64 * 1024
"""Largest request line and headers; past it a 431 (a 1 MB Authorization header
was answered with a reset connection)."""
HEAD_TIMEOUT_S = 30
"""How long a client has to send a whole request head, from its connection or from
the head's first byte; then the connection is closed. A client sending a header byte
a second (slowloris), or nothing, held a connection forever: uvicorn times out only a
connection idle after a response (timeout_keep_alive). 30 s is far more than any
client on a working network needs."""
SEND_TIMEOUT_S = 30
"""How long a response may wait for its client to read (the connection's buffers full
of what it has not read: uvicorn's writes wait for room) before the connection is
dropped, which cancels a reply still running as a client gone does. A client that sent
a streamed request and never read held its connection forever, and the engine wrote the
whole reply to nobody. Writes wait only once the kernel's buffers and uvicorn's 64 KiB
are full: 30 s of that is a client that no longer reads."""
HEAD_DRAIN_BYTES = 4 * 1024 * 1024
"""How much more of an over-long head is read (and dropped) after the 431, so that
the client, still sending, reads the answer instead of a reset."""


def head_length(buffered: bytes) -> int:
    """How long the request head at the start of `buffered` is: to its blank line
    (as h11 finds it), or all of it while that has not come yet."""
    end = _HEAD_END.search(buffered)
    return end.end() if end else len(buffered)


_HEAD_END = re.compile(rb"\n\r?\n")


def http_protocol():
    """uvicorn's HTTP/1.1 protocol (h11), answering a request head over HEAD_BYTES
    with a 431 in OpenAI's error format instead of a bare 400 (h11 catches a head
    still incomplete past the limit; a whole one read at once is measured here), and
    timing the head (HEAD_TIMEOUT_S) and a client's reading (SEND_TIMEOUT_S)."""
    import json

    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol

    body = json.dumps({"error": {
        "message": f"The request's headers are over {HEAD_BYTES // 1024} KiB, this server's limit.",
        "type": "invalid_request_error", "param": None, "code": "request_header_fields_too_large"}}).encode()
    too_large = (b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: application/json\r\n"
                 b"connection: close\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body))

    class Protocol(H11Protocol):
        _dropping: int | None = None
        _head_timer: asyncio.TimerHandle | None = None
        _send_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            self._time_head()

        def connection_lost(self, exc: Exception | None) -> None:
            for timer in (self._head_timer, self._send_timer):
                if timer is not None:
                    timer.cancel()
            super().connection_lost(exc)

        def pause_writing(self) -> None:
            """SEND_TIMEOUT_S runs while the transport's buffer is full, and ends once it has room."""
            super().pause_writing()
            if self._send_timer is None:
                self._send_timer = asyncio.get_running_loop().call_later(SEND_TIMEOUT_S, self._drop_stalled)

        def resume_writing(self) -> None:
            super().resume_writing()
            if self._send_timer is not None:
                self._send_timer.cancel()
                self._send_timer = None

        def _drop_stalled(self) -> None:
            """Abort, not close: close would wait for the unread bytes to be sent. The
            request then sees its client gone, and what runs of its reply is cancelled."""
            client = "%s:%d" % self.client if self.client else "a client"
            log.warning("%s did not read its reply for %g s: connection dropped, the rest of the reply cancelled",
                        client, SEND_TIMEOUT_S)
            self.transport.abort()

        def data_received(self, data: bytes) -> None:
            if self._dropping is not None:
                self._dropping += len(data)
                if self._dropping > HEAD_DRAIN_BYTES:
                    self.transport.close()
            elif self.conn.their_state is h11.IDLE and head_length(self.conn.trailing_data[0] + data) > HEAD_BYTES:
                self._refuse_head()
            else:
                super().data_received(data)
                self._time_head()

        def _time_head(self) -> None:
            """HEAD_TIMEOUT_S runs while a head is awaited and ends once it is whole
            (h11 has read the request line and headers: the client's state leaves IDLE)."""
            if self.conn.their_state is not h11.IDLE:
                if self._head_timer is not None:
                    self._head_timer.cancel()
                    self._head_timer = None
            elif self._head_timer is None:
                self._head_timer = asyncio.get_running_loop().call_later(HEAD_TIMEOUT_S, self.transport.close)

        def send_400_response(self, msg: str) -> None:
            if len(self.conn.trailing_data[0]) <= HEAD_BYTES:
                return super().send_400_response(msg)
            self._refuse_head()

        def _refuse_head(self) -> None:
            """The 431, then the rest of the head is read and dropped until the
            client has had time to read the answer."""
            self.transport.write(too_large)
            self._dropping = 0
            asyncio.get_running_loop().call_later(GRACEFUL_S, self.transport.close)

    return Protocol

"""A real uvicorn server in a thread, and plain HTTP requests to it (for what
the openai client would never send)."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request

from edgespec.server import bind, url
from edgespec.server.listen import uvicorn_config

KEY = "test-key"


class ServerThread:
    """uvicorn serving `app` on a free loopback port, in a thread; stopped by `stop()`."""

    def __init__(self, app):
        import uvicorn

        self.app = app
        self.sock = bind("127.0.0.1", 0)
        self.url = url(self.sock)
        self.server = uvicorn.Server(uvicorn_config(app))  # as `edgespec serve` runs it
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)
        self.thread.start()

    def wait_ready(self, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if http("GET", self.url + "/health")[0] == 200:
                return
            time.sleep(0.1)
        raise TimeoutError("the server did not become ready")

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)
        assert not self.thread.is_alive(), "the server did not stop"


def http(method: str, address: str, body: bytes | None = None, *, key: str | None = KEY,
         content_type: str = "application/json") -> tuple[int, dict]:
    """One plain HTTP request (for what the openai client would never send)."""
    headers = {"Content-Type": content_type} | ({"Authorization": f"Bearer {key}"} if key else {})
    request = urllib.request.Request(address, data=body, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, json.loads(response.read() or b"{}")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")
    except (ConnectionError, urllib.error.URLError):
        return 0, {}

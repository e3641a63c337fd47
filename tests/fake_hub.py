"""A tiny stand-in for the Hugging Face hub on 127.0.0.1, enough for edgespec's
downloader and huggingface_hub's real `hf_hub_download` (HEAD for metadata, GET
with Range to resume), so download tests exercise real HTTP without a network."""

from __future__ import annotations

import hashlib
import re
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

COMMIT = "0123456789abcdef0123456789abcdef01234567"
_RESOLVE = re.compile(r"^/(?P<repo>[^/]+/[^/]+)/resolve/(?P<rev>[^/]+)/(?P<file>.+)$")


@dataclass
class FakeHub:
    files: dict[tuple[str, str], bytes] = field(default_factory=dict)
    """(repo, filename) -> content."""
    requests: list[tuple[str, str, str | None]] = field(default_factory=list)
    """(method, path, Range header) of every request served."""
    chunk: int = 64 << 10
    delay: float = 0.0
    """Seconds to sleep after each chunk of a GET body (to make downloads take time)."""
    drop_after: int | None = None
    """Close the connection after sending this many body bytes, once (a dropped connection)."""
    gated: set[str] = field(default_factory=set)
    """Repos that answer 403 GatedRepo (the licence is not accepted)."""
    authorizations: list[str | None] = field(default_factory=list)
    """The Authorization header of every GET."""
    ignore_range: bool = False
    """Answer every GET with the whole file (200), as a server without Range support does."""
    garbled: bool = False
    """Answer every GET with something that is not HTTP (a broken proxy)."""

    def add(self, repo: str, filename: str, content: bytes) -> str:
        self.files[(repo, filename)] = content
        return hashlib.sha256(content).hexdigest()

    def start(self) -> str:
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # keep test output clean
                pass

            def do_HEAD(self):
                self._serve(body=False)

            def do_GET(self):
                self._serve(body=True)

            def _serve(self, body: bool):
                hub.requests.append((self.command, self.path, self.headers.get("Range")))
                if self.command == "GET":
                    hub.authorizations.append(self.headers.get("Authorization"))
                    if hub.garbled:
                        self.wfile.write(b"NOT HTTP AT ALL\r\n\r\n")
                        self.close_connection = True
                        return
                m = _RESOLVE.match(self.path.split("?")[0])
                if m and m["repo"] in hub.gated:
                    self.send_response(403)
                    self.send_header("X-Error-Code", "GatedRepo")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                content = hub.files.get((m["repo"], m["file"])) if m else None
                if content is None:
                    self.send_response(404)
                    self.send_header("X-Error-Code", "EntryNotFound")
                    self.send_header("X-Error-Message", "Entry not found")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                start = 0
                rng = self.headers.get("Range")
                if body and rng and not hub.ignore_range:
                    start = int(re.match(r"bytes=(\d+)-", rng).group(1))
                    self.send_response(206)
                    self.send_header("Content-Range", f"bytes {start}-{len(content) - 1}/{len(content)}")
                else:
                    self.send_response(200)
                self.send_header("X-Repo-Commit", COMMIT)
                self.send_header("ETag", f'"{hashlib.sha256(content).hexdigest()}"')
                self.send_header("Accept-Ranges", "bytes")
                self.send_header("Content-Length", str(len(content) - start))
                self.end_headers()
                if not body:
                    return
                end = len(content)
                if hub.drop_after is not None:
                    end, hub.drop_after = min(end, start + hub.drop_after), None
                    self.close_connection = True
                try:
                    for i in range(start, end, hub.chunk):
                        self.wfile.write(content[i:min(i + hub.chunk, end)])
                        if hub.delay:
                            time.sleep(hub.delay)
                except (BrokenPipeError, ConnectionResetError):
                    pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def gets(self) -> list[tuple[str, str, str | None]]:
        return [r for r in self.requests if r[0] == "GET"]

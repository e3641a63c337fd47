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
from urllib.parse import unquote

COMMIT = "0123456789abcdef0123456789abcdef01234567"
_RESOLVE = re.compile(r"^/(?P<repo>[^/]+/[^/]+)/resolve/(?P<rev>[^/]+)/(?P<file>.+)$")


@dataclass
class FakeHub:
    files: dict[tuple[str, str], bytes] = field(default_factory=dict)
    """(repo, filename) -> content at the default revision (main)."""
    other_revisions: dict[tuple[str, str, str], bytes] = field(default_factory=dict)
    """(repo, revision, filename) -> content at another revision (a tag, a branch, a commit)."""
    requests: list[tuple[str, str, str | None]] = field(default_factory=list)
    """(method, path, Range header) of every request served."""
    if_ranges: list[str | None] = field(default_factory=list)
    """The If-Range header of every GET (a resume that names the file it continues)."""
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
    portal: bytes | None = None
    """Answer every GET with 200 and this HTML page (a captive portal that wants a sign-in)."""
    busy: list[tuple[int, str | None]] = field(default_factory=list)
    """Answer the next GETs, one each, with this status and Retry-After (None: without one): a hub
    under load (429, 503)."""
    headers: dict[str, str] = field(default_factory=dict)
    """Headers sent instead of the true ones with a file's body (a broken proxy's: a Content-Range
    that names other bytes than those sent, a Content-Length that is no number)."""
    redirect_to: str | None = None
    """Answer every GET with a 302 to the same path under this base URL (the hub's CDN)."""

    def add(self, repo: str, filename: str, content: bytes, revision: str = "main") -> str:
        if revision == "main":
            self.files[(repo, filename)] = content
        else:
            self.other_revisions[(repo, revision, filename)] = content
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
                    hub.if_ranges.append(self.headers.get("If-Range"))
                    if hub.garbled:
                        self.wfile.write(b"NOT HTTP AT ALL\r\n\r\n")
                        self.close_connection = True
                        return
                    if hub.busy:
                        code, retry_after = hub.busy.pop(0)
                        self.send_response(code)
                        if retry_after is not None:
                            self.send_header("Retry-After", retry_after)
                        self.send_header("Content-Length", "0")
                        self.end_headers()
                        return
                    if hub.redirect_to is not None:
                        self.send_response(302)
                        self.send_header("Location", hub.redirect_to + self.path)
                        self.send_header("Content-Length", "0")
                        self.end_headers()
                        return
                    if hub.portal is not None:
                        self.send_response(200)
                        self.send_header("Content-Type", "text/html")
                        self.send_header("Content-Length", str(len(hub.portal)))
                        self.end_headers()
                        self.wfile.write(hub.portal)
                        return
                m = _RESOLVE.match(self.path.split("?")[0])
                if m and m["repo"] in hub.gated:
                    self.send_response(403)
                    self.send_header("X-Error-Code", "GatedRepo")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                content = None
                if m:
                    content = (hub.files.get((m["repo"], m["file"])) if m["rev"] == "main"
                               else hub.other_revisions.get((m["repo"], unquote(m["rev"]), m["file"])))
                if content is None:
                    self.send_response(404)
                    self.send_header("X-Error-Code", "EntryNotFound")
                    self.send_header("X-Error-Message", "Entry not found")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                start = 0
                rng = self.headers.get("Range")
                etag = f'"{hashlib.sha256(content).hexdigest()}"'
                if_range = self.headers.get("If-Range")
                if if_range is not None and if_range != etag:  # the file changed: all of it, afresh
                    rng = None
                headers = {"X-Repo-Commit": COMMIT, "ETag": etag, "Accept-Ranges": "bytes"}
                if body and rng and not hub.ignore_range:
                    start = int(re.match(r"bytes=(\d+)-", rng).group(1))
                    self.send_response(206)
                    headers["Content-Range"] = f"bytes {start}-{len(content) - 1}/{len(content)}"
                else:
                    self.send_response(200)
                headers["Content-Length"] = str(len(content) - start)
                for name, value in {**headers, **hub.headers}.items():
                    self.send_header(name, value)
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

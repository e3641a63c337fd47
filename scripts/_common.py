"""What the benchmark scripts share: free ports, server processes, and engines (and one
that records the prompts it is given, for the baselines to be fed the same).

The scripts run from a checkout with the project's virtualenv, where edgespec
is installed editable (`.venv/bin/python scripts/X.py`): they import edgespec
and each other (this file is beside them) without path changes. The order of
interleaved runs is edgespec.bench.rotation.
"""

from __future__ import annotations

import os
import shlex
import socket
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

REPO = Path(__file__).resolve().parents[1]


def free_port() -> int:
    """A loopback port nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def load(target: str | Path | None, draft: str | Path | None = None, *, pair: str | None = None,
         no_draft: bool = False, **options):
    """edgespec.load.load_engine as the CLI calls it: registry names or paths
    (names downloaded when missing), else `pair`'s models (None: the bundled
    pair; `no_draft`: its target alone). `options`: LoadSettings' fields."""
    from edgespec.load import load_engine
    from edgespec.load_settings import LoadSettings
    from edgespec.models.fetch import resolve_model
    from edgespec.models.registry import DEFAULT_PAIR

    return load_engine(None if target is None else str(target), None if draft is None else str(draft),
                       pair=pair or DEFAULT_PAIR, no_draft=no_draft, resolve=resolve_model,
                       settings=LoadSettings(**options))


@dataclass
class ServerSpec:
    name: str
    argv: Callable[[int], list[str]]
    """The command line for a port."""
    env: dict[str, str] | None = None


class Server:
    """One server process on a loopback port: started, waited for, always stopped."""

    def __init__(self, spec: ServerSpec, log_dir: Path):
        self.spec = spec
        self.log_path = log_dir / (spec.name.replace(" ", "_").replace("#", "") + ".log")
        self.proc: subprocess.Popen | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout_s: float) -> None:
        self.port = free_port()
        argv = self.spec.argv(self.port)
        with open(self.log_path, "a") as log:
            log.write(f"$ {shlex.join(argv)}\n")
            log.flush()
            self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                         env=self.spec.env)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.spec.name} exited ({self.proc.returncode}) while loading:\n"
                                   f"{self.log_tail()}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=5) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.5)
        raise RuntimeError(f"{self.spec.name} was not ready after {timeout_s:.0f} s:\n{self.log_tail()}")

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=20)
        self.proc = None

    def cpu_s(self) -> float:
        """CPU seconds the process has used (all its threads)."""
        if self.proc is None or self.proc.poll() is not None:
            return 0.0
        try:
            with open(f"/proc/{self.proc.pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            return 0.0
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime

    def log_tail(self, n: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-n:]
        except OSError:
            return ""


class Recorder:
    """An engine that notes the prompt tokens of each generate(): the prompts a chat
    sent, for a baseline (`Llama`, llama-server, a read from scratch) to be fed the same.
    Everything else is the engine's."""

    def __init__(self, engine):
        self.engine = engine
        self.prompts: list[list[int]] = []

    def __getattr__(self, name):
        return getattr(self.engine, name)

    def generate(self, tokens, params, **kwargs):
        self.prompts.append(list(tokens))
        return self.engine.generate(tokens, params, **kwargs)

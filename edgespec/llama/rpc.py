"""llama.cpp's RPC backend (ggml-rpc): workers' devices for a model, and the worker itself.

A worker (`rpc-server`, or `edgespec worker`) exposes its CPU or GPU as
devices; a model loaded with them in llama_model_params.devices keeps some of
its layers there. ggml-rpc has no transport errors: a connection that fails
calls ggml_abort, which ends the process. Guard turns that into
WorkerLostError: it runs the model's llama.cpp calls on a helper thread, and
an abort callback parks whichever thread hit the broken connection (the helper
or ggml-rpc's own dispatcher thread) instead of letting abort() run. The
parked threads and the model's native objects are then abandoned: freeing them
would talk to the lost worker again.
"""

from __future__ import annotations

import ctypes
import os
import re
import socket
import stat
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from queue import Queue
from typing import Callable, TypeVar

import llama_cpp
from llama_cpp._ctypes_extensions import load_shared_library

from edgespec.errors import Terminated, WorkerLostError, WorkerUnreachableError
from edgespec.llama.backend import backend_init, recent_errors
from edgespec.net import RPC_PORT, Endpoint, is_loopback

CONNECT_TIMEOUT_S = 3.0
"""How long a TCP connect to a worker may take before it counts as unreachable."""
KEEPALIVE_S = (5, 2, 3)
"""TCP keepalive on the connections to the workers: first probe after 5 s idle, then
every 2 s, lost after 3 unanswered (a worker whose machine vanished never closes
its socket; the kernel then fails the connection, and ggml-rpc's read with it)."""
SILENT_S = KEEPALIVE_S[0] + KEEPALIVE_S[1] * KEEPALIVE_S[2]
"""TCP_USER_TIMEOUT on those connections (Linux): a worker that acknowledges nothing for this
long is lost, idle or not. Keepalive probes only an idle connection, so without it a worker
that vanished mid-upload would hold the upload for the kernel's ~15 minutes of
retransmissions; the same bound as the keepalive's, as tcp(7) advises, since Linux then ends
an idle connection by this one instead. (Linux also counts a receive window the worker keeps
shut for this long.)"""
BUSY = "a worker serves one client at a time: is another edgespec or llama.cpp using it?"
HELLO_TIMEOUT_S = 15.0
"""How long a reachable worker may take to answer the first request."""

_DEV_CPU, _DEV_GPU, _DEV_IGPU = 0, 1, 2
_DEV_TYPES = {0: "CPU", 1: "GPU", 2: "iGPU", 3: "accelerator"}

T = TypeVar("T")


# -- reaching the workers ---------------------------------------------------------

def unreachable(endpoints, *, timeout: float = CONNECT_TIMEOUT_S) -> dict[Endpoint, str]:
    """The endpoints a TCP connect does not reach within `timeout`, with why."""
    failed = {}
    for endpoint in endpoints:
        try:
            socket.create_connection((endpoint.host, endpoint.port), timeout=timeout).close()
        except socket.timeout:
            failed[endpoint] = f"no answer within {timeout:g} s"
        except OSError as e:
            failed[endpoint] = e.strerror or str(e)
    return failed


def keep_alive(endpoints) -> set:
    """Turn TCP keepalive (KEEPALIVE_S) and the bound on unacknowledged data (SILENT_S)
    on for this process's connections to `endpoints`: ggml-rpc's own sockets, found
    among the open descriptors. Returns the endpoints that have one."""
    peers: dict[tuple[str, int], Endpoint] = {}
    for endpoint in endpoints:
        try:
            for *_, address in socket.getaddrinfo(endpoint.host, endpoint.port, type=socket.SOCK_STREAM):
                peers[(address[0], address[1])] = endpoint
        except OSError:
            continue
    found = set()
    folder = "/proc/self/fd" if os.path.isdir("/proc/self/fd") else "/dev/fd"
    for name in os.listdir(folder):
        try:
            fd = int(name)
            if not stat.S_ISSOCK(os.fstat(fd).st_mode):
                continue
            sock = socket.socket(fileno=os.dup(fd))
        except (ValueError, OSError):
            continue
        try:
            endpoint = peers.get(sock.getpeername()[:2]) if sock.type == socket.SOCK_STREAM else None
            if endpoint is not None:
                idle, interval, count = KEEPALIVE_S
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
                for option, value in (("TCP_KEEPIDLE", idle), ("TCP_KEEPALIVE", idle),  # the latter: macOS
                                      ("TCP_KEEPINTVL", interval), ("TCP_KEEPCNT", count),
                                      ("TCP_USER_TIMEOUT", SILENT_S * 1000)):
                    if hasattr(socket, option):
                        sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, option), value)
                found.add(endpoint)
        except OSError:
            pass
        finally:
            sock.close()  # the duplicate only: the options belong to the socket both name
    return found


def check_reachable(endpoints, *, timeout: float = CONNECT_TIMEOUT_S) -> None:
    """Raise WorkerUnreachableError naming each worker a TCP connect does not reach.
    (Handed an unreachable endpoint, ggml-rpc would end the process.)"""
    failed = unreachable(endpoints, timeout=timeout)
    if failed:
        raise WorkerUnreachableError(unreachable_message(failed))


def unreachable_message(failed: dict[Endpoint, str]) -> str:
    """For people: the workers `unreachable` found, those that are busy apart from those not there."""
    # A worker serves one client at a time and queues one more; past that, the kernel drops new
    # connections unanswered. On this machine nothing else drops them, so an unanswered one there is busy.
    busy = [e for e, why in failed.items() if why.startswith("no answer") and is_loopback(e.host)]
    away = {e: why for e, why in failed.items() if e not in busy}
    said = []
    if away:
        maybe_busy = f" A worker that does not answer may also be busy: {BUSY}" \
            if any(why.startswith("no answer") for why in away.values()) else ""
        said.append(f"cannot reach {_workers([f'{e} ({why})' for e, why in away.items()])}. Start "
                    f"{'one there' if len(away) == 1 else 'one on each'} with `edgespec worker --port PORT` (or "
                    f"llama.cpp's rpc-server), or check the address and the firewall.{maybe_busy}")
    if busy:
        one = len(busy) == 1
        sentence = (f"{_workers([str(e) for e in busy])} {'is' if one else 'are'} busy ({failed[busy[0]]}): {BUSY} "
                    f"Free {'it' if one else 'them'}, or start another with `edgespec worker --port PORT`")
        said.append(sentence[0].upper() + sentence[1:] if said else sentence)
    return " ".join(said)


def _workers(names: list[str]) -> str:
    """'the RPC worker at A', 'the RPC workers at A and B', 'the RPC workers at A, B and C'."""
    if len(names) == 1:
        return f"the RPC worker at {names[0]}"
    return f"the RPC workers at {', '.join(names[:-1])} and {names[-1]}"


# -- the libraries -------------------------------------------------------------

_lib_lock = threading.Lock()
_libs: dict[str, ctypes.CDLL | None] = {}


def _lib(name: str) -> ctypes.CDLL | None:
    """One of llama-cpp-python's ggml libraries, or None if this build lacks it.

    The very file libllama was linked against: the wheel holds libggml-base.so
    and libggml-base.so.0 as two copies, and loading the other one would give a
    second ggml with its own state (an abort callback set there is never called)."""
    with _lib_lock:
        if name not in _libs:
            folder = Path(llama_cpp.__file__).parent / "lib"
            linked = [folder / f"lib{name}.so.0", folder / f"lib{name}.0.dylib"]
            try:
                found = next((p for p in linked if p.exists()), None)
                _libs[name] = ctypes.CDLL(str(found)) if found else load_shared_library(name, folder)
            except (FileNotFoundError, OSError, RuntimeError):
                _libs[name] = None
        return _libs[name]


def _fn(lib: str, name: str, restype, *argtypes):
    library = _lib(lib)
    if library is None or not hasattr(library, name):
        return None
    fn = getattr(library, name)
    fn.restype = restype
    fn.argtypes = list(argtypes)
    return fn


class _Ggml:
    """The few ggml calls this module makes (ctypes signatures from ggml-backend.h and ggml-rpc.h)."""

    def __init__(self):
        vp, sz = ctypes.c_void_p, ctypes.c_size_t
        self.dev_count = _fn("ggml", "ggml_backend_dev_count", sz)
        self.dev_get = _fn("ggml", "ggml_backend_dev_get", vp, sz)
        self.dev_name = _fn("ggml-base", "ggml_backend_dev_name", ctypes.c_char_p, vp)
        self.dev_description = _fn("ggml-base", "ggml_backend_dev_description", ctypes.c_char_p, vp)
        self.dev_memory = _fn("ggml-base", "ggml_backend_dev_memory", None, vp, ctypes.POINTER(sz),
                              ctypes.POINTER(sz))
        self.dev_type = _fn("ggml-base", "ggml_backend_dev_type", ctypes.c_int, vp)
        self.reg_dev_count = _fn("ggml-base", "ggml_backend_reg_dev_count", sz, vp)
        self.reg_dev_get = _fn("ggml-base", "ggml_backend_reg_dev_get", vp, vp, sz)
        self.set_abort_callback = _fn("ggml-base", "ggml_set_abort_callback", vp, vp)
        self.cpu_buffer_type = _fn("ggml-base", "ggml_backend_cpu_buffer_type", vp)
        self.add_server = _fn("ggml-rpc", "ggml_backend_rpc_add_server", vp, ctypes.c_char_p)
        self.start_server = _fn("ggml-rpc", "ggml_backend_rpc_start_server", None, ctypes.c_char_p,
                                ctypes.c_char_p, sz, sz, ctypes.POINTER(vp))


_ggml: _Ggml | None = None


def _g() -> _Ggml:
    global _ggml
    if _ggml is None:
        backend_init()
        _ggml = _Ggml()
    return _ggml


def available() -> bool:
    """Whether this llama.cpp build has the RPC backend (built with -DGGML_RPC=ON)."""
    g = _g()
    return bool(llama_cpp.llama_supports_rpc()) and g.add_server is not None and g.start_server is not None


def require() -> _Ggml:
    if not available():
        raise WorkerUnreachableError(
            "this llama.cpp build has no RPC backend: reinstall with scripts/install.sh (it builds with "
            "-DGGML_RPC=ON), or CMAKE_ARGS=\"-DGGML_RPC=ON\" pip install --force-reinstall --no-cache-dir "
            "llama-cpp-python")
    return _g()


# -- devices -----------------------------------------------------------------

@dataclass(frozen=True)
class Device:
    """A device a model can keep layers on: a worker's, or a local GPU."""

    name: str
    """llama.cpp's name for it (RPC0, CUDA0, ...), as its load logs say."""
    description: str
    kind: str
    """CPU, GPU, iGPU."""
    free: int
    total: int
    endpoint: Endpoint | None = None
    """The worker it is on; None: this machine."""

    @property
    def label(self) -> str:
        """For people: 'RPC0 (10.0.0.2:50052)', 'CUDA0 (local)'."""
        return f"{self.name} ({self.endpoint or 'local'})"


def _device(ptr, endpoint: Endpoint | None) -> Device:
    g = _g()
    free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
    g.dev_memory(ptr, ctypes.byref(free), ctypes.byref(total))
    return Device(name=g.dev_name(ptr).decode(), description=g.dev_description(ptr).decode(),
                  kind=_DEV_TYPES.get(g.dev_type(ptr), "?"), free=free.value, total=total.value, endpoint=endpoint)


def local_devices() -> list[tuple[int, Device]]:
    """This machine's devices (pointer, Device), as llama.cpp registered them."""
    g = _g()
    found = []
    for i in range(g.dev_count()):
        ptr = g.dev_get(i)
        found.append((ptr, _device(ptr, None)))
    return found


def offload_devices() -> list[tuple[int, Device]]:
    """This machine's GPUs (else its integrated GPUs), which llama.cpp would offload to."""
    devices = local_devices()
    gpus = [(p, d) for p, d in devices if d.kind == "GPU"]
    return gpus or [(p, d) for p, d in devices if d.kind == "iGPU"]


class _BuftOverride(ctypes.Structure):
    """llama_model_tensor_buft_override: tensors whose name matches `pattern` go to `buft`."""

    _fields_ = [("pattern", ctypes.c_char_p), ("buft", ctypes.c_void_p)]


OUTPUT_WEIGHTS = rb"^(output|token_embd)\.weight$"
"""The output layer's matrix (a model with tied embeddings loads token_embd.weight
a second time as its output; the input copy is on the CPU anyway)."""


def local_output_overrides():
    """A NULL-terminated llama_model_tensor_buft_override array that keeps the
    output layer's weights in this machine's CPU memory (llama.cpp's -ot)."""
    return (_BuftOverride * 2)(_BuftOverride(OUTPUT_WEIGHTS, _g().cpu_buffer_type()), _BuftOverride(None, None))


_epochs: dict[Endpoint, int] = {}
"""How often each worker was lost in this process. ggml-rpc keeps one connection
per endpoint string, and the lost one is held by the abandoned model; the next
load spells the endpoint anew (the port with leading zeros, which ggml-rpc's
stoi reads as the same port) to get a fresh connection."""


def _spelling(endpoint: Endpoint) -> bytes:
    return f"{endpoint.host}:{'0' * _epochs.get(endpoint, 0)}{endpoint.port}".encode()


_stuck: str | None = None
"""Why this process can add no more workers: a handshake that failed left its thread parked
by the abort callback inside ggml_backend_rpc_add_server, holding the lock every later call
of it takes, so a later load would wait for good."""


def add_servers(endpoints) -> list[tuple[int, Device]]:
    """ggml_backend_rpc_add_server for each worker (as llama.cpp's --rpc does):
    its devices, in order. Checks each is reachable first."""
    g = require()
    if _stuck:
        raise WorkerUnreachableError(_stuck)
    check_reachable(endpoints)
    found = []
    for endpoint in endpoints:
        guard = Guard((endpoint,))  # a handshake that fails would abort the process
        reg = None
        try:
            reg = guard.call(g.add_server, _spelling(endpoint), timeout=HELLO_TIMEOUT_S)
            if reg:
                found += [(ptr, guard.call(_device, ptr, endpoint))
                          for ptr in (g.reg_dev_get(reg, i) for i in range(g.reg_dev_count(reg)))]
        except TimeoutError:
            raise WorkerUnreachableError(
                f"the RPC worker at {endpoint} took the connection but did not answer within "
                f"{HELLO_TIMEOUT_S:g} s: {BUSY} Free it, then restart edgespec (llama.cpp keeps waiting for "
                f"that answer)") from None
        except WorkerLostError:
            if reg is not None:  # the handshake went through: a worker, lost while it listed its devices
                raise
            raise WorkerUnreachableError(_failed_handshake(endpoint)) from None
        finally:
            guard.close()
        if not reg:
            raise WorkerUnreachableError(f"the RPC worker at {endpoint} offers no devices")
    return found


def _failed_handshake(endpoint: Endpoint) -> str:
    """What a handshake that ggml-rpc aborted says about what answers at `endpoint`;
    notes in `_stuck` that this process can add no more workers."""
    global _stuck
    # ggml-rpc says "handshake failed" only for a worker whose protocol version differs (it logs
    # which); any other abort here is an answer of no RPC at all, or none.
    if "handshake failed" in _last_abort:
        version = re.search(r"version mismatch: (\S+)", recent_errors())
        what = (f"the RPC worker at {endpoint} speaks another version of llama.cpp's RPC"
                f"{f' ({version.group(1)})' if version else ''} than this edgespec's llama.cpp: run the same "
                f"llama.cpp version on both machines")
    elif unreachable([endpoint], timeout=1.0):
        what = f"what answered at {endpoint} closed during the handshake and is gone now"
    else:
        what = (f"what answers at {endpoint} is not a llama.cpp RPC worker (it closed the connection or answered "
                f"something else): check the port (`edgespec worker` and rpc-server listen on {RPC_PORT} unless "
                f"told otherwise)")
    _stuck = (f"llama.cpp's RPC is stuck in this process on the failed handshake with {endpoint}: restart "
              f"edgespec to use RPC workers again")
    return f"{what}. Then restart edgespec (llama.cpp's RPC stays stuck in this process on a failed handshake)"


# -- turning ggml-rpc's abort into an exception --------------------------------------

_RPC_ABORTS = ("Remote RPC server", "Failed to connect to", "RPC handshake failed")
_aborts = 0
_last_abort = ""
_abort_lock = threading.Lock()


@ctypes.CFUNCTYPE(None, ctypes.c_char_p)
def _on_abort(message: bytes) -> None:
    """ggml_abort's callback. abort() follows when it returns: for a broken RPC
    connection it never returns (the thread waits forever and Guard.call raises);
    any other abort goes ahead as llama.cpp means it to."""
    global _aborts, _last_abort
    text = (message or b"").decode("utf-8", errors="replace")
    if not any(marker in text for marker in _RPC_ABORTS):
        sys.stderr.write(text + "\n")
        return
    with _abort_lock:
        _aborts += 1
        last = text.strip().splitlines()[-1] if text.strip() else "connection lost"
        _last_abort = re.sub(r"^\S+:\d+: ", "", last)  # without ggml's source file and line
    threading.Event().wait()


_callback_set = False


def _install_abort_callback() -> None:
    global _callback_set
    with _abort_lock:
        if not _callback_set:
            _g().set_abort_callback(ctypes.cast(_on_abort, ctypes.c_void_p))
            _callback_set = True


class _Runner:
    """One daemon thread that runs calls in order (a thread stuck on a lost worker
    is abandoned, and never holds up the interpreter's exit)."""

    def __init__(self):
        self._jobs: Queue = Queue()
        threading.Thread(target=self._work, name="edgespec-rpc", daemon=True).start()

    def _work(self) -> None:
        while (job := self._jobs.get()) is not None:
            job()

    def submit(self, job: Callable[[], None]) -> None:
        self._jobs.put(job)

    def close(self) -> None:
        """End the thread once the calls before are done."""
        self._jobs.put(None)


STUCK_WAIT_S = 2.0
"""How long a call waits for one that Ctrl+C or SIGTERM interrupted to return before the worker is
taken for lost: a healthy decode ends within it, a stopped or stuck worker never does."""


class Guard:
    """Runs the llama.cpp calls of one model that has layers on workers, so that
    a lost worker raises WorkerLostError (naming it) instead of ending the process."""

    def __init__(self, endpoints):
        self.endpoints = tuple(endpoints)
        self.lost: str | None = None
        """Why the model is unusable, once a worker was lost."""
        self._unwatched = set(self.endpoints)
        """Workers whose connection has no keepalive yet (ggml-rpc connects on first use)."""
        self._watch_tries = 16
        self._interrupted: threading.Event | None = None
        """The call that Ctrl+C or SIGTERM left running on the guard's thread (its `done`), until it returns."""
        _install_abort_callback()
        self._runner = _Runner()

    def call(self, fn: Callable[..., T], *args, timeout: float | None = None) -> T:
        """fn(*args) on the guard's thread. Raises WorkerLostError if a worker is
        lost meanwhile (or was before), TimeoutError after `timeout` seconds."""
        if self.lost:
            raise WorkerLostError(self.lost)
        if self._interrupted is not None:  # queued behind a call that may never return, this one would wait too
            if not self._interrupted.wait(STUCK_WAIT_S):
                self._lose(f"the call that was interrupted did not return within {STUCK_WAIT_S:g} s: the worker is "
                           f"stopped or stuck", gone={})
            self._interrupted = None
        done = threading.Event()
        box: dict = {}

        def job() -> None:
            try:
                box["value"] = fn(*args)
            except BaseException as e:  # handed back to the caller below
                box["error"] = e
            finally:
                done.set()

        aborts = _aborts
        self._runner.submit(job)
        start = time.monotonic()
        # A lost worker shows on the connection in use: a killed one resets it (ggml-rpc's read fails and
        # aborts), a vanished machine fails its keepalive. A second connection could not tell: a worker
        # serves one client at a time, so it would never answer one while busy with ours.
        try:
            while not done.wait(0.05):
                if timeout is not None and time.monotonic() - start > timeout:
                    self._runner = _Runner()  # the old thread stays stuck in the call
                    raise TimeoutError
                if _aborts != aborts:
                    self._lose(_last_abort)
        except (KeyboardInterrupt, Terminated):  # Ctrl+C, SIGTERM: the call goes on on the guard's thread,
            self._interrupted = done  # and the next ones must not queue behind it
            raise
        if self._unwatched and self._watch_tries > 0:  # a few calls, not every decode, if one is never found
            self._watch_tries -= 1
            self._unwatched -= keep_alive(self._unwatched)
        if "error" in box:
            raise box["error"]
        return box["value"]

    def close(self) -> None:
        """End the guard's thread (left alone if a lost worker holds it)."""
        if not self.lost:
            self._runner.close()

    def _lose(self, why: str, gone: dict | None = None) -> None:
        gone = gone if gone is not None else unreachable(self.endpoints, timeout=1.0)
        lost = list(gone) or list(self.endpoints)
        for endpoint in lost:  # the next load connects to them afresh; the others' connections still work
            _epochs[endpoint] = _epochs.get(endpoint, 0) + 1
        self.lost = f"lost {_workers([str(e) for e in lost])} ({why})"
        raise WorkerLostError(self.lost)


# -- the worker ----------------------------------------------------------------

def worker_devices(names: list[str] | None = None) -> list[tuple[int, Device]]:
    """The devices a worker serves: those named, else its GPUs, else its CPU (as rpc-server)."""
    devices = local_devices()
    if names:
        by_name = {d.name.lower(): (p, d) for p, d in devices}
        missing = [n for n in names if n.lower() not in by_name]
        if missing:
            raise ValueError(f"unknown device {', '.join(missing)}: this machine has "
                             f"{', '.join(d.name for _, d in devices)}")
        return [by_name[n.lower()] for n in names]
    gpus = [(p, d) for p, d in devices if d.kind in ("GPU", "iGPU")]
    return gpus or [(p, d) for p, d in devices if d.kind == "CPU"][:1]


def start_server(endpoint: Endpoint, devices: list[tuple[int, Device]], *, n_threads: int,
                 cache_dir: str | None = None) -> threading.Thread:
    """ggml_backend_rpc_start_server on a daemon thread (it serves until the process ends)."""
    g = require()
    ptrs = (ctypes.c_void_p * len(devices))(*[p for p, _ in devices])
    cache = cache_dir.encode() if cache_dir else None
    thread = threading.Thread(target=g.start_server, args=(str(endpoint).encode(), cache, n_threads,
                                                             len(devices), ptrs),
                              name="edgespec-worker", daemon=True)
    thread._edgespec_keep = ptrs  # the device array must outlive the call
    thread.start()
    return thread

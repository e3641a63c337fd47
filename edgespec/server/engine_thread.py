"""The one thread that touches the engine.

There is one engine and its KV caches are one conversation's state, so every
use of it runs on this thread, one job at a time, in arrival order (a FIFO
queue: none lost, none interleaved). A job is a generator function; what it
yields is passed to the request's event loop as it comes. Cancelling a job
(its client went away) stops it after the current item (a resource with an
`interrupt()`, as the engine, stops the decode in progress too: a long prompt's
batch), and the generator is closed so that the engine leaves its caches
consistent; the next job starts at once.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from typing import Any, Callable, Generic, Iterator, TypeVar

T = TypeVar("T")
R = TypeVar("R")


class Cancelled(Exception):
    """A job stopped before its end: its client went away, or the server is stopping."""


class Job(Generic[R, T]):
    """One request's work, and the channel its results travel back on."""

    def __init__(self, work: Callable[[R], Iterator[T]], loop: asyncio.AbstractEventLoop):
        self.work = work
        self._loop = loop
        self._results: asyncio.Queue = asyncio.Queue()
        self._cancelled = threading.Event()
        self._lock = threading.Lock()
        self._interrupt: Callable[[], None] | None = None
        """While the job runs: what stops its resource's work in progress."""

    def cancel(self) -> None:
        """Stop the job (or skip it, if it has not started); safe from any thread, any time."""
        with self._lock:
            self._cancelled.set()
            if self._interrupt is not None:
                self._interrupt()

    def _running(self, interrupt: Callable[[], None] | None) -> None:
        with self._lock:
            self._interrupt = interrupt

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    # -- the engine thread's side
    def _send(self, kind: str, value: Any = None) -> None:
        try:
            self._loop.call_soon_threadsafe(self._results.put_nowait, (kind, value))
        except RuntimeError:  # the event loop is closed: nobody is listening any more
            self.cancel()

    # -- the request's side
    def __aiter__(self):
        return self

    async def __anext__(self) -> T:
        kind, value = await self._results.get()
        if kind == "item":
            return value
        if kind == "error":
            raise value
        raise StopAsyncIteration


class EngineThread(Generic[R]):
    """Loads a resource on its own thread, runs jobs on it one at a time, closes it on stop.

    `load` returns the resource (anything with `close()`, and `interrupt()` if its
    work can be stopped mid-item from another thread); until it has, the
    thread is not ready, and if it fails, `error` says why. A job that fails
    with one of `fatal` (the resource can no longer be used, as an engine
    whose RPC worker went away) closes the resource, and the next job loads it
    again first; until that works, `lost` says why."""

    def __init__(self, load: Callable[[], R], *, fatal: tuple[type[BaseException], ...] = ()):
        self._load = load
        self._fatal = fatal
        self._jobs: queue.Queue[Job | None] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="edgespec-engine", daemon=True)
        self._loaded = threading.Event()
        self._stopping = False
        self._current: Job | None = None
        self.resource: R | None = None
        self.error: BaseException | None = None
        self.lost: BaseException | None = None
        """What made the resource unusable; it is loaded again at the next job."""

    @property
    def ready(self) -> bool:
        return self.resource is not None and not self._stopping

    @property
    def queued(self) -> int:
        return self._jobs.qsize()

    def start(self) -> None:
        self._thread.start()

    def wait_loaded(self, timeout: float | None = None) -> bool:
        """Block until loading has ended, well or not; False on timeout."""
        return self._loaded.wait(timeout)

    def submit(self, work: Callable[[R], Iterator[T]]) -> Job[R, T]:
        """Queue `work` (call from the event loop); it runs after every job queued before it."""
        job = Job(work, asyncio.get_running_loop())
        self._jobs.put(job)
        return job

    def stop(self) -> None:
        """Cancel the running and queued jobs, wait for the thread, close the resource."""
        self._stopping = True
        current = self._current
        if current is not None:
            current.cancel()
        self._jobs.put(None)
        if self._thread.is_alive():
            self._thread.join()

    # -- the thread
    def _run(self) -> None:
        try:
            self.resource = self._load()
        except BaseException as e:  # reported by whoever waits for loading (the CLI exits with it)
            self.error = e
            return
        finally:
            self._loaded.set()
        try:
            while (job := self._jobs.get()) is not None:
                if self._stopping:
                    job.cancel()
                self._current = job
                if self.lost is None or self._reload(job):
                    self._execute(job)
                self._current = None
        finally:
            if self.lost is None:
                self.resource.close()

    def _reload(self, job: Job) -> bool:
        if job.cancelled:
            job._send("error", self._cancel_error())
            return False
        try:
            self.resource = self._load()
        except Exception as e:  # still unusable (the RPC worker is away): this job is told why, the next tries again
            job._send("error", e)
            return False
        self.lost = None
        return True

    def _cancel_error(self) -> Cancelled:
        return Cancelled("the server is shutting down" if self._stopping else "cancelled")

    def _execute(self, job: Job) -> None:
        try:
            if job.cancelled:
                raise Cancelled()
            items = job.work(self.resource)
            job._running(getattr(self.resource, "interrupt", None))
            try:
                if job.cancelled:  # cancelled before it could be interrupted
                    raise Cancelled()
                for item in items:
                    job._send("item", item)
                    if job.cancelled:
                        raise Cancelled()
                if job.cancelled:  # interrupted: the work ended early
                    raise Cancelled()
            finally:
                job._running(None)
                items.close()  # runs the job's cleanup (the engine's cache bookkeeping) now
        except Cancelled:
            job._send("error", self._cancel_error())
        except Exception as e:
            if isinstance(e, self._fatal):
                self.lost = e
                self.resource.close()
            job._send("error", e)
        else:
            job._send("end")

"""The one thread that touches the engine.

There is one engine and its KV caches are one conversation's state, so every
use of it runs on this thread, one job at a time, in arrival order (a FIFO
queue: none lost, none interleaved). A job is a generator function; what it
yields is passed to the request's event loop as it comes. Cancelling a job
(its client went away) stops it after the current item (a resource with an
`interrupt()`, as the engine, stops the decode in progress too: a long prompt's
batch), and the generator is closed so that the engine leaves its caches
consistent; the next job starts at once.

Between jobs, while none waits, the thread does the resource's idle work (the
engine reading ahead what the next request will likely start with): a job
submitted meanwhile interrupts it, so that no request waits for it.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from typing import Any, Callable, Generic, Iterator, TypeVar

log = logging.getLogger("edgespec.server")

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
    again first; until that works, `lost` says why.

    `idle` gives the work to do while no job waits (none: nothing), as a job's is
    done, but what it yields goes to nobody, a job submitted meanwhile interrupts
    it, and a failure is only logged, unless it is one of `fatal`."""

    IDLE_INTERRUPT_S = 0.02
    """How often a job that waits for idle work interrupts it again until it has
    stopped: the resource may forget an interrupt that came just before its work began."""

    def __init__(self, load: Callable[[], R], *, fatal: tuple[type[BaseException], ...] = (),
                 idle: Callable[[R], Iterator[Any]] | None = None):
        self._load = load
        self._fatal = fatal
        self._idle = idle
        self._idle_lock = threading.Lock()
        self._idling = False
        """Whether the idle work runs (under _idle_lock: a job that comes then interrupts it)."""
        self._idle_runs = 0
        """How many times the idle work has begun: a job interrupts the run it found, not a later one."""
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
        """Queue `work` (call from the event loop); it runs after every job queued before
        it, and stops the idle work at once."""
        loop = asyncio.get_running_loop()
        job = Job(work, loop)
        with self._idle_lock:
            self._jobs.put(job)
            run = self._idle_runs
        self._interrupt_idle(run, loop)
        return job

    def _interrupt_idle(self, run: int, loop: asyncio.AbstractEventLoop | None = None) -> None:
        """Interrupt the idle work's `run`, if it runs, and with `loop`, again every
        IDLE_INTERRUPT_S until it has stopped."""
        with self._idle_lock:  # held while interrupting: the idle work cannot end and a job begin meanwhile
            if not self._idling or self._idle_runs != run:
                return
            interrupt = getattr(self.resource, "interrupt", None)
            if interrupt is not None:
                interrupt()
        if loop is not None:
            loop.call_later(self.IDLE_INTERRUPT_S, self._interrupt_idle, run, loop)

    def stop(self) -> None:
        """Cancel the running and queued jobs, wait for the thread, close the resource."""
        self._stopping = True
        current = self._current
        if current is not None:
            current.cancel()
        with self._idle_lock:
            self._jobs.put(None)
            run = self._idle_runs
        while self._thread.is_alive():
            self._interrupt_idle(run)
            self._thread.join(self.IDLE_INTERRUPT_S)

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
            while (job := self._next_job()) is not None:
                if self._stopping:
                    job.cancel()
                self._current = job
                if self.lost is None or self._reload(job):
                    self._execute(job)
                self._current = None
        finally:
            if self.lost is None:
                self.resource.close()

    def _next_job(self) -> Job | None:
        """The next job, doing the idle work first if none waits."""
        if self._idle is not None and self.lost is None and not self._stopping:
            self._do_idle_work()
        return self._jobs.get()

    def _do_idle_work(self) -> None:
        with self._idle_lock:
            if not self._jobs.empty():
                return
            self._idling = True
            self._idle_runs += 1
        items: Iterator[Any] | None = None
        try:
            items = self._idle(self.resource)
            for _ in items:
                if not self._jobs.empty():
                    break
        except Exception as e:  # nobody asked for this work: nobody to tell, unless the resource is lost
            if isinstance(e, self._fatal):
                self.lost = e
                self.resource.close()
            else:
                log.warning("reading ahead failed: %s", e)
        finally:
            with self._idle_lock:
                self._idling = False
            if self.lost is None:
                getattr(items, "close", lambda: None)()

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

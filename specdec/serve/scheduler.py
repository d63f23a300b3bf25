"""One generation at a time on a worker thread; a bounded line of requests waiting for it.

The engine decodes one sequence at a time, so requests are served in arrival order by a single
worker thread and the event loop never blocks on a model pass. `submit` admits a request only while
fewer than `max_pending` are running or waiting; past that it raises `ServerBusy` (the server
answers 429). A job is cancelled by its request when the client goes away: a waiting job gives its
place back at once, a running one stops at the end of the current round.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from specdec.engine import Engine, GenerationConfig, Piece
from specdec.errors import SpecdecError
from specdec.stats import GenerationStats

log = logging.getLogger("specdec.serve")


class ServerBusy(Exception):
    pass


@dataclass
class Update:
    """What the worker hands to the request: committed pieces, or the end (final stats), or an error."""

    pieces: list[Piece]
    stats: GenerationStats | None = None  # set on the last update
    error: str | None = None  # set when generation failed
    user_error: bool = False  # the failure was the request's fault (a SpecdecError)


class Job:
    def __init__(self, engine: Engine, prompt_ids: list[int], config: GenerationConfig,
                 loop: asyncio.AbstractEventLoop) -> None:
        self.engine = engine
        self.prompt_ids = prompt_ids
        self.config = config
        self.updates: asyncio.Queue[Update] = asyncio.Queue()
        self._loop = loop
        self._cancelled = threading.Event()
        self._lock = threading.Lock()  # orders "started" against "cancelled"
        self.started = False
        self.released = False  # its place in the line was given back

    def cancel(self) -> bool:
        """Ask the job to stop; True when it had already started (it stops at the end of its round)."""
        with self._lock:
            self._cancelled.set()
            return self.started

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    def _send(self, update: Update) -> None:
        self._loop.call_soon_threadsafe(self.updates.put_nowait, update)

    def run(self, on_start) -> None:
        """Worker thread: stream the generation into `updates`, stopping early when cancelled."""
        with self._lock:
            if self.cancelled:
                return
            self.started = True
        self._loop.call_soon_threadsafe(on_start)
        try:
            stream = self.engine.stream(self.prompt_ids, self.config)
            for event in stream:
                if self.cancelled:
                    stream.close()
                    return
                self._send(Update(event.pieces, event.stats if event.done else None))
        except SpecdecError as exc:
            self._send(Update([], error=str(exc), user_error=True))
        except Exception as exc:  # a bug: logged with its traceback, reported without it
            log.exception("generation failed")
            self._send(Update([], error=f"generation failed: {type(exc).__name__}: {exc}"))


class Scheduler:
    def __init__(self, max_pending: int, on_change=None) -> None:
        if max_pending < 1:
            raise SpecdecError(f"the queue bound must be >= 1, got {max_pending}")
        self.max_pending = max_pending
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="specdec-generate")
        self._jobs: list[Job] = []  # admitted and not yet released, in arrival order
        self._on_change = on_change or (lambda running, waiting: None)

    @property
    def running(self) -> int:
        return sum(1 for j in self._jobs if j.started)

    @property
    def waiting(self) -> int:
        return sum(1 for j in self._jobs if not j.started)

    def submit(self, engine: Engine, prompt_ids: list[int], config: GenerationConfig) -> Job:
        """Admit a job (event loop only); raises ServerBusy past the bound."""
        if len(self._jobs) >= self.max_pending:
            raise ServerBusy(f"the server is busy: {len(self._jobs)} requests are running or waiting, "
                             f"the bound is {self.max_pending}; retry later")
        loop = asyncio.get_running_loop()
        job = Job(engine, prompt_ids, config, loop)
        self._jobs.append(job)
        future = loop.run_in_executor(self._executor, job.run, self._changed)
        future.add_done_callback(lambda _: self.release(job))
        self._changed()
        return job

    def cancel(self, job: Job) -> None:
        """The client went away: stop the job; a job still waiting gives its place back now."""
        if not job.cancel():
            self.release(job)

    def release(self, job: Job) -> None:
        if not job.released:
            job.released = True
            self._jobs.remove(job)
            self._changed()

    def _changed(self) -> None:
        self._on_change(self.running, self.waiting)

    def close(self) -> None:
        """Shutdown: cancel what is left and wait for the worker to stop (at most one round)."""
        for job in list(self._jobs):
            self.cancel(job)
        self._executor.shutdown(wait=True, cancel_futures=True)

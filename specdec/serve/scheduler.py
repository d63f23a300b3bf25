"""Continuous batching: one worker thread decodes every running request in one batch.

Requests are admitted on the event loop (`submit`) while fewer than `max_pending` are running or
waiting; past that `submit` raises `ServerBusy` (the server answers 429). A waiting request joins
the batch when there is a row free and its row's KV cache fits beside the running rows' within
`memory_budget` (serve/memory.py). A row's cache grows as the row does (`Row.slots_next_round`):
before each round every row's cache is grown for the round, and where they would not all fit the
budget, the rows that joined last are preempted: their caches are freed, they wait at the head of
the line, and when there is room again they recompute their caches and go on where they were, with
the same output (`Row.preempt`). The oldest row always fits (a request whose whole cache is larger
than the budget is refused at `submit`), so every request finishes. The worker thread owns a
`Batch` (`decode/batch.py`): between rounds it lets waiting requests join, in arrival order, while the batch
has fewer than `max_batch` rows, drops the rows of requests whose client went away, and runs one
round over all rows (a joining request's prompt goes in by chunks, so it does not stall the others).
Each row's committed pieces go back to its request as `Update`s. A request that is cancelled while
waiting gives its place back at once; a running one leaves the batch at the next round. A finished
request's place is given back before its last update is sent, so a client that sends its next
request on reading the answer always finds its place free.

A row is the unit of failure: an error in one row's drafting, pass or commit ends that request with
an error update and leaves the others running (`Batch.step`). An error outside the rounds (a bug in
the worker itself) fails every admitted request, and the scheduler is `broken` from then on: it
refuses new requests (`ServerBroken`) and the server's /health answers 503.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import deque
from dataclasses import dataclass

from specdec.decode.batch import Batch, Row
from specdec.decode.text import Piece
from specdec.decode.engine import Engine, GenerationConfig
from specdec.errors import SpecdecError
from specdec.records.stats import GenerationStats

log = logging.getLogger("specdec.serve")


class ServerBusy(Exception):
    pass


class CacheTooLarge(Exception):
    """A job's row would need more KV cache than the whole budget: it could never join."""

    def __init__(self, need: int, budget: int) -> None:
        super().__init__(f"a row of {need} cache bytes can never fit the budget of {budget}")
        self.need, self.budget = need, budget


class ServerBroken(Exception):
    """The worker stopped on an error it could not contain: no request can be served any more."""


@dataclass
class Update:
    """What the worker hands to the request: committed pieces, or the end (final stats), or an error."""

    pieces: list[Piece]
    stats: GenerationStats | None = None  # set on the last update
    error: str | None = None  # set when generation failed
    user_error: bool = False  # the failure was the request's fault (a SpecdecError)


class Job:
    def __init__(self, engine: Engine, prompt_ids: list[int], config: GenerationConfig,
                 loop: asyncio.AbstractEventLoop, cache_bytes: int = 0, first_bytes: int | None = None) -> None:
        self.engine = engine
        self.cache_bytes = cache_bytes  # its row's KV cache at its largest (the prompt, max_tokens, a draft)
        self.first_bytes = cache_bytes if first_bytes is None else first_bytes  # its row's cache when it joins
        self.row: Row | None = None  # its row, once preempted: it joins again as it is
        self.prompt_ids = prompt_ids
        self.config = config
        self.updates: asyncio.Queue[Update] = asyncio.Queue()
        self._loop = loop
        self._cancelled = threading.Event()
        self._lock = threading.Lock()  # orders "started" against "cancelled"
        self.started = False
        self.released = False  # its place in the line was given back

    def cancel(self) -> bool:
        """Ask the job to stop; True when it had already started (it leaves the batch at the next round)."""
        with self._lock:
            self._cancelled.set()
            return self.started

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    def start(self) -> bool:
        """Worker thread: mark the job started unless it was cancelled first."""
        with self._lock:
            if self.cancelled:
                return False
            self.started = True
            return True

    def send(self, update: Update) -> None:
        self._loop.call_soon_threadsafe(self.updates.put_nowait, update)


class Scheduler:
    def __init__(self, max_pending: int, on_change=None, max_batch: int = 1, on_round=None,
                 memory_budget: int | None = None) -> None:
        if max_pending < 1:
            raise SpecdecError(f"the queue bound must be >= 1, got {max_pending}")
        if max_batch < 1:
            raise SpecdecError(f"the batch bound must be >= 1, got {max_batch}")
        self.max_pending = max_pending
        self.max_batch = max_batch
        self.memory_budget = memory_budget  # bytes the running rows' KV caches may hold together; None: no bound
        self._jobs: list[Job] = []  # admitted and not yet released, in arrival order (event loop only)
        self._line: deque[Job] = deque()  # admitted and not yet taken by the worker
        self._wake = threading.Condition()
        self._closing = False
        self._worker: threading.Thread | None = None
        self._on_change = on_change or (lambda running, waiting: None)
        self._on_round = on_round or (lambda rows, gammas: None)
        self.broken: str | None = None  # why the worker stopped, once it has
        self.preemptions = 0  # rows whose caches were freed for older rows (each recomputed later)

    @property
    def running(self) -> int:
        return sum(1 for j in self._jobs if j.started)

    @property
    def waiting(self) -> int:
        return sum(1 for j in self._jobs if not j.started)

    def check_room(self) -> None:
        """Raise ServerBusy when the line is full, ServerBroken when the worker has stopped (a request
        checks before its prompt is tokenized)."""
        if self.broken is not None:
            raise ServerBroken(f"the server cannot generate any more: {self.broken}; restart it")
        if len(self._jobs) >= self.max_pending:
            raise ServerBusy(f"the server is busy: {len(self._jobs)} requests are running or waiting, "
                             f"the bound is {self.max_pending}; retry later")

    def submit(self, engine: Engine, prompt_ids: list[int], config: GenerationConfig, cache_bytes: int = 0,
               first_bytes: int | None = None) -> Job:
        """Admit a job (event loop only); raises ServerBusy past the bound. A job whose row's first cache
        (`first_bytes`) does not fit beside the running rows' waits in line until it does; one whose
        largest cache (`cache_bytes`) is larger than the whole budget raises CacheTooLarge (it could
        never finish)."""
        self.check_room()
        if self.memory_budget is not None and cache_bytes > self.memory_budget:
            raise CacheTooLarge(cache_bytes, self.memory_budget)
        job = Job(engine, prompt_ids, config, asyncio.get_running_loop(), cache_bytes, first_bytes)
        self._jobs.append(job)
        with self._wake:
            if self._worker is None:
                self._worker = threading.Thread(target=self._work, name="specdec-generate", daemon=True)
                self._worker.start()
            self._line.append(job)
            self._wake.notify()
        self._changed()
        return job

    def cancel(self, job: Job) -> None:
        """The client went away: stop the job; a job still waiting gives its place back now."""
        if not job.cancel():
            self.release(job)
        with self._wake:
            self._wake.notify()

    def release(self, job: Job) -> None:
        if not job.released:
            job.released = True
            self._jobs.remove(job)
            self._changed()

    def _changed(self) -> None:
        self._on_change(self.running, self.waiting)

    def _finished(self, job: Job) -> None:
        """Worker thread: the job is over; its place is given back on the event loop."""
        job._loop.call_soon_threadsafe(self.release, job)

    def _work(self) -> None:
        """Worker thread: the rounds, and if they stop on an error they could not contain, every
        admitted job fails and the scheduler is broken."""
        jobs: dict[Row, Job] = {}  # the batch's rows → their jobs
        try:
            self._rounds(jobs)
        except BaseException as exc:  # a bug outside any one row: nothing can be served after it
            log.exception("the generation worker stopped")
            self.broken = f"the generation worker stopped on {type(exc).__name__}: {exc}"
            with self._wake:
                waiting, self._line = list(self._line), deque()
            for job in [*jobs.values(), *waiting]:
                self._fail(job, self.broken)
            self._on_round(0, [])

    def _rounds(self, jobs: dict[Row, Job]) -> None:
        """Admit, drop the cancelled, run a round; sleep while there is nothing to do."""
        batch: Batch | None = None
        while True:
            with self._wake:
                while not self._closing and not self._line and not (batch and batch.rows):
                    self._wake.wait()
                if self._closing:
                    break
                joining = []
                held = sum(row.bytes_next_round() for row in jobs)
                while self._line and self._line[0].cancelled:  # gave its place back already (`cancel`)
                    cancelled = self._line.popleft()
                    if cancelled.row is not None:  # a preempted row's job: its place is given back here
                        self._finished(cancelled)
                while self._line and len(jobs) + len(joining) < self.max_batch and self._fits(held, self._line[0]):
                    held += self._need(self._line[0])
                    joining.append(self._line.popleft())
            for job in joining:
                if job.row is not None:  # preempted: it goes on where it was
                    batch.add(job.row)
                    jobs[job.row] = job
                    job.row = None
                    continue
                if not job.start():
                    continue  # cancelled while waiting: already released
                self._job_changed(job)
                try:
                    row = job.engine.row(job.prompt_ids, job.config)
                except SpecdecError as exc:
                    self._fail(job, str(exc), user_error=True)
                    continue
                except Exception as exc:  # a bug: logged with its traceback, reported without it
                    log.exception("starting a generation failed")
                    self._fail(job, f"generation failed: {type(exc).__name__}: {exc}")
                    continue
                batch = batch or Batch(job.engine.target)
                batch.add(row)
                jobs[row] = job
            for row, job in list(jobs.items()):
                if job.cancelled:  # the client went away: its row leaves now
                    batch.remove(row)
                    del jobs[row]
                    self._finished(job)
            if not batch or not batch.rows:
                self._on_round(0, [])  # at rest: no rows
                continue
            self._make_room(batch, jobs)
            events = batch.step()  # a row's own error comes back as its event; the others go on
            self._on_round(*batch.last_round)
            for row, event in events:
                job = jobs[row]
                if event.error is not None:
                    del jobs[row]
                    user_error = isinstance(event.error, SpecdecError)
                    if not user_error:  # a bug: logged with its traceback, reported without it
                        log.error("a request's generation failed", exc_info=event.error)
                    message = str(event.error) if user_error else \
                        f"generation failed: {type(event.error).__name__}: {event.error}"
                    self._fail(job, message, user_error=user_error)
                elif event.done:  # its place is free before the answer's end reaches the client
                    del jobs[row]
                    self._finished(job)
                    job.send(Update(event.pieces, event.stats))
                else:
                    job.send(Update(event.pieces))
            if not batch.rows:
                self._on_round(0, [])
        preempted = [job for job in self._line if job.row is not None]
        for job in [*jobs.values(), *preempted]:  # closing: whatever is left ends now
            self._finished(job)

    def _fits(self, held: int, job: Job) -> bool:
        """Whether the job's row fits beside rows needing `held` cache bytes (in arrival order: a job
        that does not fit holds the line, so a long request is not passed over for ever)."""
        return self.memory_budget is None or held + self._need(job) <= self.memory_budget

    @staticmethod
    def _need(job: Job) -> int:
        """The cache bytes the job's row needs for its first round in the batch."""
        return job.row.bytes_next_round() if job.row is not None else job.first_bytes

    def _make_room(self, batch: Batch, jobs: dict[Row, Job]) -> None:
        """Grow every row's cache for the next round within the budget: where they would not all fit,
        the rows that joined last leave the batch, preempted (their caches freed; at the head of the
        line, in order, they join again when there is room), so the rows that joined first go on."""
        rows = list(jobs)  # in the order they joined
        needs = [row.bytes_next_round() for row in rows]
        while self.memory_budget is not None and len(rows) > 1 and sum(needs) > self.memory_budget:
            row, _ = rows.pop(), needs.pop()
            job = jobs.pop(row)
            batch.remove(row)
            row.preempt()
            job.row = row
            self.preemptions += 1
            with self._wake:
                self._line.appendleft(job)
        for row in rows:
            row.cache.grow(row.slots_next_round())

    def _job_changed(self, job: Job) -> None:
        job._loop.call_soon_threadsafe(self._changed)

    def _fail(self, job: Job, message: str, user_error: bool = False) -> None:
        self._finished(job)  # the place first, then the news (both in order on the event loop)
        job.send(Update([], error=message, user_error=user_error))

    def close(self) -> None:
        """Shutdown: cancel what is left and wait for the worker to stop (at most one round)."""
        for job in list(self._jobs):
            self.cancel(job)
        with self._wake:
            self._closing = True
            self._wake.notify()
        if self._worker is not None:
            self._worker.join()

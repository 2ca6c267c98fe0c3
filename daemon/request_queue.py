"""The request queue and the engine thread: queued requests run one at a time, in order (batch 1).

Front ends `put` requests from their own threads; the queue is bounded (overflow is an
`overloaded` error, answered at once). One thread pops the jobs and hands each to the engine's
`execute`, which ends every job with exactly one terminal event. Cancelling a queued job takes it
out of the queue and answers it on the caller's thread (not after the running request ends); the
running job sees its `cancelled` flag at its next step.
"""
from __future__ import annotations

import collections
import threading
from dataclasses import dataclass, field
from typing import Callable

from ..protocol.messages import TERMINAL_EVENTS, error_event

__all__ = ["Emit", "Job", "RequestQueue"]

Emit = Callable[[dict], None]


@dataclass(slots=True)
class Job:
    request: object
    emit: Emit                 # the front end's sink (front ends may tag it, e.g. emit.client)
    cancelled: threading.Event = field(default_factory=threading.Event)
    queue: "RequestQueue | None" = None

    def send(self, event: dict) -> None:
        """Emit an event; before a terminal one the queue marks the job finished, so a `status`
        sent right after "done" never still shows this request running."""
        if event.get("event") in TERMINAL_EVENTS and self.queue is not None:
            self.queue.finish(self)
        self.emit(event)


class RequestQueue:
    def __init__(self, max_queue: int, execute: Callable[[Job], None]):
        self.max_queue = max_queue
        self._execute = execute
        self._jobs: collections.deque[Job] = collections.deque()
        self._cv = threading.Condition()
        self._running: Job | None = None
        self._stopping = False
        self._thread: threading.Thread | None = None
        self.n_served = 0

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="flashd-engine", daemon=True)
        self._thread.start()

    def put(self, request, emit: Emit) -> None:
        """Queue a request, or answer it at once with an error when the daemon is stopping or
        the queue is full."""
        with self._cv:
            if self._stopping:
                emit(error_event(request.id, "cancelled", "the daemon is shutting down"))
                return
            if len(self._jobs) >= self.max_queue:
                emit(error_event(request.id, "overloaded",
                                 f"request queue is full ({self.max_queue} waiting); retry later"))
                return
            self._jobs.append(Job(request, emit, queue=self))
            self._cv.notify()

    def cancel_where(self, predicate: Callable[[Job], bool]) -> int:
        """Cancel every pending job the predicate selects; the number cancelled."""
        with self._cv:
            jobs = list(self._jobs) + ([self._running] if self._running else [])
            hit = [j for j in jobs if predicate(j) and not j.cancelled.is_set()]
            for job in hit:
                job.cancelled.set()
            queued = [j for j in hit if j is not self._running]
            for job in queued:
                self._jobs.remove(job)
        for job in queued:
            job.emit(error_event(job.request.id, "cancelled", "cancelled before it started"))
        return len(hit)

    def close(self) -> None:
        """Accept nothing more and cancel what is queued or running: the queued jobs still pass
        through `execute`, which answers each with its `cancelled` error, then the thread ends."""
        with self._cv:
            self._stopping = True
            for job in self._jobs:
                job.cancelled.set()
            if self._running is not None:
                self._running.cancelled.set()
            self._cv.notify_all()

    def join(self, timeout: float | None = None) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    def snapshot(self) -> tuple[str | None, int]:
        """(the running request's id or None, the number queued), read together."""
        with self._cv:
            return (self._running.request.id if self._running else None), len(self._jobs)

    def finish(self, job: Job) -> None:
        with self._cv:
            if self._running is job:
                self._running = None
                self.n_served += 1

    def _loop(self) -> None:
        while True:
            with self._cv:
                while not self._jobs and not self._stopping:
                    self._cv.wait()
                if self._stopping and not self._jobs:
                    return
                job = self._jobs.popleft()
                self._running = job
            try:
                self._execute(job)
            finally:
                self.finish(job)

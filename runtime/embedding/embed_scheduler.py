"""The embedding scheduler: requests' inputs packed together into each llama_decode.

One worker thread owns the Embedder. Each submitted request is a list of fitted token
lists; the worker takes inputs from the queued requests in arrival order, as many as one
decode holds (the batch's tokens, the context's sequences), so eight requests of one
sentence each cost one decode, and a request of 256 inputs shares its decodes with the
requests that arrive meanwhile. A request finishes when its last input has been pooled;
its callback gets the raw vectors, in order, or the error (docs/DESIGN.md, "Embeddings").
"""

from __future__ import annotations

import collections
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

from tallow.common.errors import TallowError
from tallow.runtime.embedding.embed import Embedder


class EmbedQueueFull(TallowError):
    pass


@dataclass(eq=False)  # a job is itself: two requests with the same inputs are two jobs
class EmbedJob:
    inputs: list[list[int]]
    on_done: Callable[[object], None]  # called once, from the worker: list of vectors, or an exception
    results: list = field(default_factory=list)
    next: int = 0  # the first input not yet taken into a decode
    finished: int = 0
    cancelled: bool = False
    queued_at: float = field(default_factory=time.perf_counter)
    started_at: float | None = None

    def cancel(self) -> None:
        self.cancelled = True


@dataclass
class EmbedCounters:
    requests: int = 0
    inputs: int = 0
    tokens: int = 0
    decodes: int = 0
    rejected: int = 0


class EmbedScheduler:
    def __init__(self, embedder: Embedder, max_queued_inputs: int = 65536) -> None:
        self.embedder = embedder
        self.engine = embedder.engine
        self.max_queued_inputs = max_queued_inputs
        self.counters = EmbedCounters()
        self.busy = False
        self._jobs: collections.deque[EmbedJob] = collections.deque()
        self._waiting_inputs = 0
        self._cv = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._work, name="tallow-embed", daemon=True)
        self._thread.start()

    @property
    def queue_depth(self) -> int:
        """Inputs queued and not yet decoded."""
        return self._waiting_inputs

    def submit(self, inputs: list[list[int]], on_done: Callable[[object], None]) -> EmbedJob:
        job = EmbedJob(inputs, on_done, results=[None] * len(inputs))
        with self._cv:
            if self._closed:
                raise TallowError("the server is stopping")
            if self._waiting_inputs + len(inputs) > self.max_queued_inputs and self._jobs:
                self.counters.rejected += 1
                raise EmbedQueueFull(f"{self._waiting_inputs} inputs are waiting")
            self._jobs.append(job)
            self._waiting_inputs += len(inputs)
            self._cv.notify()
        return job

    def _take(self) -> list[tuple[EmbedJob, int]]:
        """(job, input index) pairs for one decode, in arrival order; called with the lock."""
        taken: list[tuple[EmbedJob, int]] = []
        used = 0
        for job in list(self._jobs):
            if job.cancelled:
                self._drop(job)
                continue
            while job.next < len(job.inputs) and len(taken) < self.embedder.max_seqs:
                n = len(job.inputs[job.next])
                if taken and used + n > self.engine.n_batch:
                    return taken
                taken.append((job, job.next))
                used += n
                job.next += 1
                if job.started_at is None:
                    job.started_at = time.perf_counter()
            if len(taken) >= self.embedder.max_seqs:
                break
        return taken

    def _drop(self, job: EmbedJob) -> None:
        self._waiting_inputs -= len(job.inputs) - job.next
        self._jobs.remove(job)

    def _work(self) -> None:
        while True:
            with self._cv:
                while not self._closed and not self._jobs:
                    self._cv.wait()
                if self._closed:
                    for job in self._jobs:
                        job.on_done(TallowError("the server is stopping"))
                    self._jobs.clear()
                    return
                taken = self._take()
                self._waiting_inputs -= len(taken)
                for job in {id(j): j for j, _ in taken}.values():
                    if job.next == len(job.inputs):
                        self._jobs.remove(job)
                self.busy = bool(taken)
            if not taken:
                continue
            try:
                vectors = self.embedder.decode([job.inputs[i] for job, i in taken])
            except Exception as exc:  # noqa: BLE001 - every job in this decode hears of it
                failed = {id(j): j for j, _ in taken}
                with self._cv:
                    for job in failed.values():
                        if job in self._jobs:
                            self._drop(job)
                for job in failed.values():
                    job.cancelled = True
                    job.on_done(exc)
                self.busy = False
                continue
            self.counters.decodes += 1
            for (job, i), vec in zip(taken, vectors):
                if job.cancelled:
                    continue
                job.results[i] = vec
                job.finished += 1
                self.counters.inputs += 1
                self.counters.tokens += len(job.inputs[i])
                if job.finished == len(job.inputs):
                    self.counters.requests += 1
                    job.on_done(job.results)
            self.busy = False

    def close(self) -> None:
        with self._cv:
            self._closed = True
            self._cv.notify_all()
        self._thread.join(timeout=30)
        self.embedder.close()

"""The scheduler's media chunks: encoded on a worker thread while the other sequences keep
decoding, then evaluated into their sequence by the engine thread (docs/DESIGN.md, "Media").

ctypes releases the GIL during the encode, so the engine thread goes on stepping; an encode
competes for the same cores, so other streams slow down while it runs but never stop.
"""

from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Any

from tallow.runtime.media.spans import Span


class MediaPrefill:
    def __init__(self, engine) -> None:
        self.engine = engine
        self._pool: ThreadPoolExecutor | None = None
        self._encoding: dict[int, Future] = {}  # id(job) -> its span's encode

    def _encode(self, span: Span) -> tuple[Any, float]:
        started = time.perf_counter()
        embd = self.engine.projector.encode(span.chunk, self.engine.model.n_embd)
        return embd, (time.perf_counter() - started) * 1000

    def evaluate(self, job, span: Span) -> bool:
        """Whether the job's sequence now holds the span: its encode is started on the first
        call, and the embeddings are decoded once it is done. Raises what the encode raised."""
        key = id(job)
        future = self._encoding.get(key)
        if future is None:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(1, thread_name_prefix="tallow-encode")
            self._encoding[key] = self._pool.submit(self._encode, span)
            return False
        if not future.done():
            return False
        del self._encoding[key]
        embd, ms = future.result()
        job.run.timings.media_ms += ms
        seq = job.held.sequence
        next_pos = self.engine.projector.decode(self.engine.ctx, span.chunk, embd, seq.next_pos, seq.seq)
        seq.placed(job.request.prompt_tokens[span.start:span.end], next_pos)
        return True

    def busy(self) -> bool:
        return bool(self._encoding)

    def wait(self, timeout: float) -> None:
        """Block until an encode finishes (when nothing else is left to step)."""
        wait(list(self._encoding.values()), timeout, return_when="FIRST_COMPLETED")

    def forget(self, job) -> None:
        """A job that ended: its encode, if any, finishes unheard."""
        self._encoding.pop(id(job), None)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None


def span_at(spans: tuple[Span, ...], position: int) -> Span | None:
    return next((s for s in spans if s.start == position), None)


def next_span(spans: tuple[Span, ...], position: int) -> int | None:
    """Where the next span at or after `position` starts."""
    return next((s.start for s in spans if s.start >= position), None)

"""Sharing between requests: which waiting request a free slot goes to next, and how a
step's prefill budget is split between the prompts being evaluated.

First come, first served within a tenant (an API key's name: `Request.tenant`); between
tenants, in turn, the tenant served longest ago first (one never served before goes first).
So a key with a hundred requests queued cannot hold back another key's one: that one is
admitted at the next free slot; and while several keys are active, one slot is kept free for
the others (a key sending one request at a time then does not wait for a slot at all). With
no tenants (every request None) this is plain FIFO.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any, Iterator, Sequence

HOLD_S = 2.0  # seconds after another tenant was last served during which one slot is kept for it


class FairQueue:
    """A queue of scheduler jobs (anything with `.request.tenant`)."""

    def __init__(self) -> None:
        self.jobs: deque[Any] = deque()
        self.served: dict[str | None, int] = {}  # tenant -> the admission count when last served
        self.seen: dict[str, float] = {}  # tenant -> when it last had a request admitted or in a slot
        self.count = 0

    def append(self, job: Any) -> None:
        self.jobs.append(job)

    def remove(self, job: Any) -> None:
        self.jobs.remove(job)

    def __len__(self) -> int:
        return len(self.jobs)

    def __iter__(self) -> Iterator[Any]:
        return iter(self.jobs)

    def peek(self, slots: Sequence[Any] = ()) -> Any | None:
        """The job the next free slot goes to (the queue must not be empty); None when the last
        free slot is kept: its tenant already holds a slot, and another tenant that holds none
        was served in the last HOLD_S seconds (one sending a request at a time), which then
        finds it free instead of waiting for the flood's next request to end."""
        # min() keeps the first of equals: one tenant's (or no tenant's) requests stay in arrival order
        job = min(self.jobs, key=lambda j: self.served.get(j.request.tenant, -1))
        tenant = job.request.tenant
        busy = [s.job.request.tenant for s in slots if s.job is not None]
        now = time.monotonic()
        self.seen.update((t, now) for t in busy if t is not None)  # being served is being active
        if tenant is None or len(slots) - len(busy) != 1 or tenant not in busy:
            return job
        if not any(t != tenant and t not in busy and now - at < HOLD_S for t, at in self.seen.items()):
            return job  # every other recent tenant is being served: nobody to keep the slot for
        # the slot is kept for the others: one of theirs that waits, else nobody
        return next((j for j in sorted(self.jobs, key=lambda j: self.served.get(j.request.tenant, -1))
                     if j.request.tenant != tenant), None)

    def take(self, job: Any) -> None:
        """`job` is admitted: its tenant's turn is over."""
        self.jobs.remove(job)
        self.count += 1
        self.served[job.request.tenant] = self.count
        if job.request.tenant is not None:
            self.seen[job.request.tenant] = time.monotonic()


def prefill_order(active: list[Any]) -> list[Any]:
    """The jobs whose prompts are still being evaluated, shortest remainder first: each takes
    at most an equal share of what is left of the step's budget, so what a short prompt does
    not need goes on to the longer ones, and one very long prompt cannot take every prefill
    step while another waits behind it."""
    waiting = [j for j in active if j.run.t_decode_start is None and len(j.held.kv) < len(j.request.prompt_tokens)]
    return sorted(waiting, key=lambda j: len(j.request.prompt_tokens) - len(j.held.kv))

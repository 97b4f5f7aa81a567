"""Sharing between requests: which waiting request a free slot goes to next, and how a
step's prefill budget is split between the prompts being evaluated.

First come, first served within a tenant (an API key's name: `Request.tenant`); between
tenants, in turn, the tenant served longest ago first (one never served before goes first).
So a key with a hundred requests queued cannot hold back another key's one: that one is
admitted at the next free slot. With no tenants (every request None) this is plain FIFO.
"""

from __future__ import annotations

from collections import deque
from typing import Any, Iterator


class FairQueue:
    """A queue of scheduler jobs (anything with `.request.tenant`)."""

    def __init__(self) -> None:
        self.jobs: deque[Any] = deque()
        self.served: dict[str | None, int] = {}  # tenant -> the admission count when last served
        self.count = 0

    def append(self, job: Any) -> None:
        self.jobs.append(job)

    def remove(self, job: Any) -> None:
        self.jobs.remove(job)

    def __len__(self) -> int:
        return len(self.jobs)

    def __iter__(self) -> Iterator[Any]:
        return iter(self.jobs)

    def peek(self) -> Any:
        """The job the next free slot goes to (the queue must not be empty)."""
        # min() keeps the first of equals: one tenant's (or no tenant's) requests stay in arrival order
        return min(self.jobs, key=lambda j: self.served.get(j.request.tenant, -1))

    def take(self, job: Any) -> None:
        """`job` is admitted: its tenant's turn is over."""
        self.jobs.remove(job)
        self.count += 1
        self.served[job.request.tenant] = self.count


def prefill_order(active: list[Any]) -> list[Any]:
    """The jobs whose prompts are still being evaluated, shortest remainder first: each takes
    at most an equal share of what is left of the step's budget, so what a short prompt does
    not need goes on to the longer ones, and one very long prompt cannot take every prefill
    step while another waits behind it."""
    waiting = [j for j in active if j.run.t_decode_start is None and len(j.held.kv) < len(j.request.prompt_tokens)]
    return sorted(waiting, key=lambda j: len(j.request.prompt_tokens) - len(j.held.kv))

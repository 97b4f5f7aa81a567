"""The scheduler's counters, as /metrics reports them."""

from __future__ import annotations

from dataclasses import dataclass, field

from tallow.runtime.scheduling.histogram import Histogram
from tallow.runtime.types import FinalEvent


@dataclass
class Stats:
    """Counters for /metrics; written by the engine thread, read by anyone."""

    requests: dict[str, int] = field(default_factory=dict)  # by finish reason
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    ttft: Histogram = field(default_factory=Histogram.latency)
    itl: Histogram = field(default_factory=Histogram.latency)
    steps: int = 0
    rejected: int = 0  # requests refused because the queue was full
    draft_tokens: int = 0  # drafted tokens verified, of finished requests
    accepted_tokens: int = 0  # ... of which confirmed
    draft_steps: int = 0  # decode steps that verified a draft

    def count(self, final: FinalEvent) -> None:
        """A finished request's share."""
        u = final.usage
        self.requests[final.finish_reason] = self.requests.get(final.finish_reason, 0) + 1
        self.prompt_tokens += u.prompt_tokens or 0  # always counted by this engine
        self.cached_tokens += u.cached_tokens or 0
        self.completion_tokens += u.completion_tokens
        self.draft_tokens += u.draft_tokens
        self.accepted_tokens += u.accepted_tokens
        self.draft_steps += u.draft_steps

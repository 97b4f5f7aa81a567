"""A thread-safe histogram of latencies: the scheduler observes, the server's /metrics renders."""

from __future__ import annotations

import bisect
import threading

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0, 30.0)


class Histogram:
    def __init__(self, buckets: tuple[float, ...]) -> None:
        self.buckets = tuple(sorted(buckets))
        self.counts = [0] * (len(self.buckets) + 1)  # the last one is +Inf
        self.sum = 0.0
        self._lock = threading.Lock()

    @classmethod
    def latency(cls) -> Histogram:
        return cls(LATENCY_BUCKETS)

    def observe(self, value: float) -> None:
        with self._lock:
            self.counts[bisect.bisect_left(self.buckets, value)] += 1
            self.sum += value

    @property
    def count(self) -> int:
        return sum(self.counts)

    def snapshot(self) -> tuple[tuple[float, ...], list[int], float]:
        """(bucket bounds, counts per bucket with +Inf last, sum), consistent with each other."""
        with self._lock:
            return self.buckets, list(self.counts), self.sum

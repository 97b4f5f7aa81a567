"""`tallow serve` as one replica among several behind a load balancer.

A replica is alive (GET /health answers 200) as long as its process serves HTTP, and ready
(GET /ready answers 200) only when a new request would be served promptly: not while the
models named at start load, not while any model loads, not while draining. SIGTERM starts
a drain: readiness turns false, every new request is refused with 503 and Retry-After (the
balancer sends it elsewhere), the requests already in flight run to their end, and then
the process exits 0; a grace period bounds the wait (docs/DESIGN.md, "Replicas").
"""

from __future__ import annotations

import threading
import time

PROBES = ("/health", "/ready", "/metrics")  # answered even while draining: balancers keep watching


class Replica:
    """The front's life as a replica: starting, draining, and the requests in flight."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.starting = True  # the models named at start are still loading
        self.draining = False
        self.drain_started: float | None = None
        self.inflight = 0  # HTTP requests being answered (probes not counted)
        self.refused = 0  # requests refused because the replica was draining

    def started(self) -> None:
        with self.cond:
            self.starting = False

    def admit(self) -> bool:
        """Count a new request in, or refuse it (False) while draining."""
        with self.cond:
            if self.draining:
                self.refused += 1
                return False
            self.inflight += 1
            return True

    def done(self) -> None:
        with self.cond:
            self.inflight -= 1
            self.cond.notify_all()

    def drain(self) -> None:
        with self.cond:
            if not self.draining:
                self.draining, self.drain_started = True, time.monotonic()
            self.cond.notify_all()

    def wait_idle(self, grace_s: float) -> bool:
        """Block until nothing is in flight (True), or until `grace_s` seconds have passed since
        the drain began (False: what is still running will be cut)."""
        with self.cond:
            start = self.drain_started if self.drain_started is not None else time.monotonic()
            while self.inflight > 0:
                left = start + grace_s - time.monotonic()
                if left <= 0:
                    return False
                self.cond.wait(min(left, 0.5))
            return True

    def readiness(self, loading: list[str]) -> tuple[bool, str | None]:
        """(ready, why not) given the models loading now."""
        if self.draining:
            return False, "draining"
        if loading:
            return False, "loading " + ", ".join(sorted(loading))
        if self.starting:
            return False, "starting"
        return True, None

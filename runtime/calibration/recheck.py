"""Measuring the machine again at a quiet moment, when its stored calibration cannot be
trusted (docs/DESIGN.md, "Calibration").

A calibration taken while the machine was busy keeps its timings but is not acted on
(llama.cpp's defaults stand), one whose timings were implausible twice kept none, and one
that a run found wrong in use (its decode slowed with depth well past the prediction:
runtime/calibration/watch.py) is not acted on either: left alone, each would stand for ever. A server has quiet moments that a single run does not,
so its front calls `Recheck.tick` now and then, on a thread of its own: when the stored
profile is one of those, nothing has been asked of the server for `quiet_s`, and the
machine's load is under calibration's own bar for busy, it measures again in a child at a
lower priority (requests that arrive meanwhile go first). What it measured is kept only if
no request arrived while it ran and the machine stayed quiet; models loaded from then on
use it. Never in a request's path: a request waits for nothing of this.
"""

from __future__ import annotations

import os
import threading
from typing import Any, Callable

from tallow.runtime.calibration.machine import BUSY

QUIET_S = 120.0  # seconds with no request before the server measures the machine again
EVERY_S = 30.0  # how often the front asks
NICE = 10  # the probe child's niceness while a server measures again


def untrusted(profile: Any) -> str | None:
    """Why a stored calibration should be taken again; None when it can be trusted."""
    if getattr(profile, "busy", False):
        load = getattr(profile, "load", None)
        return "the machine was busy when it was measured" + (f" (load {load:.2f})" if load is not None else "")
    if "implausible" in (getattr(profile, "timing_error", "") or ""):
        return "its timings were implausible"
    if getattr(profile, "seen", ""):
        return f"a run saw its prediction fail: {profile.seen}"
    return None


def quiet(load: float | None, cpus: int) -> bool:
    """A load average under calibration's bar for busy (an unknown load is not quiet)."""
    return load is not None and load <= BUSY * cpus


def load_average() -> float | None:
    try:
        return os.getloadavg()[0]
    except OSError:
        return None


class Recheck:
    """One server's re-measurement. `current()`: the stored profile (None: none yet); `measure()`: a new one,
    not stored; `store(profile)`: store it; `activity()`: (seconds since the server last
    had a request in flight, requests it has seen)."""

    def __init__(self, current: Callable[[], Any], measure: Callable[[], Any], store: Callable[[Any], None],
                 activity: Callable[[], tuple[float, int]], quiet_s: float = QUIET_S,
                 load: Callable[[], float | None] | None = None, cpus: int | None = None) -> None:
        self.current, self.measure, self.store, self.activity = current, measure, store, activity
        self.quiet_s, self.load, self.cpus = quiet_s, load or load_average, cpus or os.cpu_count() or 1
        self.settled = False  # the stored profile can be trusted: nothing more to do

    def tick(self) -> str | None:
        """Measure again if it is time; a line for the server's log when it did."""
        if self.settled:
            return None
        stored = self.current()
        why = untrusted(stored) if stored is not None else None  # none yet: the first load calibrates
        if why is None:
            self.settled = stored is not None
            return None
        idle, seen = self.activity()
        if idle < self.quiet_s or not quiet(self.load(), self.cpus):
            return None
        fresh = self.measure()
        if self.activity()[1] != seen:
            return f"note: measured this machine again ({why}), but a request arrived meanwhile: nothing kept"
        again = untrusted(fresh)
        if again is not None:
            return f"note: measured this machine again ({why}), and again {again}: nothing kept"
        self.store(fresh)
        self.settled = True
        return f"note: measured this machine again while idle ({why}); models loaded from now on use it"

    def run(self, stop: threading.Event, log: Callable[[str], None], every_s: float = EVERY_S) -> None:
        """Tick every `every_s` until `stop` is set (a daemon thread's body)."""
        while not stop.wait(every_s):
            try:
                line = self.tick()
            except Exception as e:  # a failed measurement must not take the server's thread with it
                line, self.settled = f"note: measuring this machine again failed: {e}", True
            if line:
                log(line)

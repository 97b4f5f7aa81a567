"""How many threads to decode with: the cores actually free, not the cores there are.

llama.cpp's threads busy-wait for each other at every graph node, so a thread that shares
its core with another busy process stalls all of them: two engines with a thread per core
each decode at a quarter of the speed of one alone (docs/DESIGN.md, "Threads"). So:
- at start, an engine takes the cores that the other tallow engines (a small registry of
  files under TALLOW_HOME) and every other process (CPU time over the model's load) leave;
- while decoding, every INTERVAL_S it measures again what the rest of the machine used
  (system CPU time less its own) and moves to the cores left, when two measurements in a
  row agree; llama.cpp takes a new thread count between decode calls.
A pinned count (--threads) is never changed. A runner counts the CPU time of the server
that started it as its own (`related`): that server spends it relaying this engine's tokens.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

INTERVAL_S = 0.5


def physical_cores() -> int:
    import psutil

    return psutil.cpu_count(logical=False) or psutil.cpu_count() or 1


def thread_rule(given: int | None, adapt: bool, all_on_gpu: bool) -> tuple[int | None, str]:
    """(the pinned thread count, or None to follow the free cores; the rule, in words). With
    every layer on a GPU the CPU's threads only feed it, so llama.cpp's own default holds."""
    if given:
        return given, "pinned (--threads)"
    if all_on_gpu:
        return physical_cores(), "llama.cpp's default, the physical cores: every layer runs on a GPU"
    if adapt:
        return None, "the free physical cores, followed while decoding"
    return physical_cores(), "the physical cores"


def _busy(related: tuple[int, ...] = ()) -> tuple[float, float]:
    """(CPU seconds used by the whole machine, by this process and `related` ones) so far."""
    import psutil

    t = psutil.cpu_times()
    idle = t.idle + getattr(t, "iowait", 0.0)
    total = sum(t) - getattr(t, "guest", 0.0) - getattr(t, "guest_nice", 0.0)  # guest time is already in user
    own = os.times()
    mine = own.user + own.system
    for pid in related:
        try:
            times = psutil.Process(pid).cpu_times()
            mine += times.user + times.system
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return total - idle, mine


class Registry:
    """One small file per running engine (its pid and thread count); dead ones are swept."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.mine = folder / f"{os.getpid()}.json"

    def peers(self) -> dict[int, int]:
        import psutil

        found: dict = {}
        try:
            entries = list(self.folder.glob("*.json"))
        except OSError:
            return found
        for entry in entries:
            pid = int(entry.stem) if entry.stem.isdigit() else -1
            if pid == os.getpid():
                continue
            if pid <= 0 or not psutil.pid_exists(pid):
                entry.unlink(missing_ok=True)
                continue
            try:
                found[pid] = int(json.loads(entry.read_text())["threads"])
            except (OSError, ValueError, KeyError, TypeError):
                continue
        return found

    def claim(self, threads: int) -> None:
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            tmp = self.mine.with_suffix(".tmp")
            tmp.write_text(json.dumps({"threads": threads, "since": time.time()}))
            os.replace(tmp, self.mine)
        except OSError:
            pass  # coordination is a courtesy: never fail a run over it

    def release(self) -> None:
        self.mine.unlink(missing_ok=True)


class Governor:
    """Chooses the thread count at start and adapts it while decoding."""

    def __init__(self, cores: int, pinned: int | None, registry: Registry | None = None,
                 related: tuple[int, ...] = ()) -> None:
        self.cores = max(1, cores)
        self.pinned = pinned
        self.registry = registry
        self.related = related  # a runner's server: relaying this engine's tokens is not "the rest of the machine"
        self.threads = pinned or self.cores
        self._mark = (time.perf_counter(), *_busy(related))
        self._proposal: int | None = None
        self.changes = 0

    def pin(self, threads: int | None) -> None:
        """Decode with exactly `threads` from now on (None: keep following the free cores)."""
        if threads:
            self.pinned = self.threads = threads

    def _others(self) -> float | None:
        """Cores the rest of the machine kept busy since the last mark (None: too short to tell)."""
        now, busy, own = time.perf_counter(), *_busy(self.related)
        wall = now - self._mark[0]
        if wall < 0.05:
            return None
        others = (busy - self._mark[1] - max(0.0, own - self._mark[2])) / wall
        self._mark = (now, busy, own)
        return max(0.0, others)

    def _free(self, others: float) -> int:
        return max(1, min(self.cores, round(self.cores - others)))

    def start(self) -> int:
        """The count to create the context with (after the load: that is the first window)."""
        if self.pinned:
            return self.pinned
        others = self._others()
        n = self._free(others) if others is not None else self.cores
        if self.registry is not None:
            peers = self.registry.peers()
            n = max(1, min(n, self.cores // (len(peers) + 1)))
            self.registry.claim(n)
        self.threads = n
        return n

    def pace(self, ctx) -> None:
        """Call once per decode step: moves `ctx` to the cores now free, at most every INTERVAL_S."""
        if self.pinned or time.perf_counter() - self._mark[0] < INTERVAL_S:
            return
        others = self._others()
        if others is None:
            return
        target = self._free(others)
        if target == self.threads:
            self._proposal = None
            return
        if self._proposal != target:  # wait for a second window to agree
            self._proposal = target
            return
        self._proposal = None
        self.threads = target
        self.changes += 1
        ctx.set_threads(target)
        if self.registry is not None:
            self.registry.claim(target)

    def close(self) -> None:
        if self.registry is not None and not self.pinned:
            self.registry.release()

"""Processes' memory and open files through a long run, judged after warm-up: the soak's
(tests/benchmarks/soak.py) check that nothing grows."""

from __future__ import annotations

import os
import statistics
import time
from pathlib import Path

MB = 2**20


class Growth:
    """Samples of one long-lived process (the front) and of short-lived ones (runners come
    and go: a leak in them shows as higher peaks later in the run)."""

    def __init__(self) -> None:
        self.front: list[tuple[float, int, int]] = []  # (t, RSS, open files)
        self.others: list[tuple[float, int, int]] = []  # the same, of every other process alive then

    def sample(self, front: int, others: list[int]) -> None:
        now = time.monotonic()
        if (got := usage_of(front)) is not None:
            self.front.append((now, *got))
        for pid in others:
            if (got := usage_of(pid)) is not None:
                self.others.append((now, *got))

    def judge(self, n_others: int) -> list[str]:
        """The last third against the second (the first is warm-up): the front's median RSS and
        most open files, the runners' peaks. Prints what it compared; returns the failures."""
        if len(self.front) < 9:
            return []
        third = len(self.front) // 3
        mid, last = self.front[third:2 * third], self.front[2 * third:]
        rss = statistics.median(s[1] for s in mid), statistics.median(s[1] for s in last)
        fds = max(s[2] for s in mid), max(s[2] for s in last)
        t = [s[0] - self.front[0][0] for s in self.front[third:]]
        r = [s[1] / MB for s in self.front[third:]]
        slope = statistics.linear_regression(t, r).slope * 60 if len(set(t)) > 1 else 0.0
        print(f"front RSS {rss[0] / MB:.1f} -> {rss[1] / MB:.1f} MB (slope after warm-up {slope:+.2f} MB/min), "
              f"open files {fds[0]} -> {fds[1]}")
        out = grew("the front's", rss, fds)
        split = last[0][0]
        parts = [s for s in self.others if mid[0][0] <= s[0] < split], [s for s in self.others if s[0] >= split]
        if all(parts):
            peak_rss = max(s[1] for s in parts[0]), max(s[1] for s in parts[1])
            peak_fds = max(s[2] for s in parts[0]), max(s[2] for s in parts[1])
            print(f"runners' peak RSS {peak_rss[0] / MB:.1f} -> {peak_rss[1] / MB:.1f} MB, open files "
                  f"{peak_fds[0]} -> {peak_fds[1]} ({n_others} runners in all)")
            out += grew("the runners' peak", peak_rss, peak_fds)
        return out


def grew(whose: str, rss: tuple[float, float], fds: tuple[int, int]) -> list[str]:
    out = []
    if rss[1] > rss[0] * 1.2 + 32 * MB:
        out.append(f"{whose} RSS grew from {rss[0] / MB:.0f} to {rss[1] / MB:.0f} MB after warm-up")
    if fds[1] > fds[0] + 16:
        out.append(f"{whose} open files grew from {fds[0]} to {fds[1]} after warm-up")
    return out


def usage_of(pid: int) -> tuple[int, int] | None:
    """A live process's RSS (bytes) and open files, or None once it is gone."""
    try:
        rss = int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        return rss, len(os.listdir(f"/proc/{pid}/fd"))
    except (OSError, IndexError, ValueError):
        return None

"""The speed a context sees, against what the calibration predicted (docs/DESIGN.md,
"Calibration").

The flash-attention choice rests on how the cost of a decode step grows with the depth of
the context: the calibration measured that growth for each mode on its small model, and
`Profile.decode_slope` scales it to a model's attention width. A run checks it: each
single-sequence decode call's time is kept by the depth it ran at, and the growth seen
between the shallowest and the deepest depths seen (each at its tenth percentile, since a
shared machine only ever slows a call) is compared with the prediction. Growth well past
the prediction means the timings the choice was made on do not hold here (a calibration
fooled by a noisy moment, a machine that changed): the profile is marked, its choice falls
back to llama.cpp's default, and a server re-measures at a quiet moment. Only a run on a
quiet machine says so: other work slows deep steps as much as shallow ones in proportion,
so a loaded machine shows growth the kernels do not have (the default model's decode grew
5.2x as fast as predicted with the test suite running beside it, 1.1-1.2x alone), and
falling back on that evidence would undo a right choice.

Cheap enough for every token: an append to a list until a depth bucket is full.
"""

from __future__ import annotations

import os
from typing import Callable

from tallow.runtime.calibration.machine import BUSY

BUCKET = 512  # context positions per depth bucket
KEEP = 64  # samples kept per bucket
ENOUGH = 32  # samples a bucket needs before it counts
SPAN = 1024  # positions between the shallowest and the deepest bucket compared, at least
FACTOR = 2.5  # growth seen over growth predicted that says the prediction does not hold


class DepthWatch:
    """Decode-call times by depth, for one context; `predicted`: the calibration's growth of
    a step's time per position of depth (seconds), None when nothing is to be checked."""

    def __init__(self, predicted: float | None, quiet: Callable[[int], bool] | None = None) -> None:
        self.predicted = predicted if predicted is not None and predicted > 0 else None
        self.buckets: dict[int, list[float]] = {}
        self.quiet = quiet or quiet_beside  # whether the machine is quiet but for this run's own threads

    def seen(self, depth: int, seconds: float) -> None:
        if self.predicted is None:
            return
        kept = self.buckets.setdefault(depth // BUCKET, [])
        if len(kept) < KEEP:
            kept.append(seconds)

    def growth(self) -> float | None:
        """Seconds a step's time grew per position of depth, from the shallowest full bucket
        to the deepest; None until both are full and far enough apart."""
        full = sorted(b for b, kept in self.buckets.items() if len(kept) >= ENOUGH)
        if len(full) < 2 or (full[-1] - full[0]) * BUCKET < SPAN:
            return None
        low, high = (_low(self.buckets[b]) for b in (full[0], full[-1]))
        return (high - low) / ((full[-1] - full[0]) * BUCKET)

    def verdict(self) -> str | None:
        """Why the calibration's prediction does not hold here (None: it holds, or too little
        was seen to say)."""
        growth = self.growth()
        if self.predicted is None or growth is None or growth <= FACTOR * self.predicted:
            return None
        return (f"decode slowed with depth {growth / self.predicted:.1f}x as fast as the calibration predicted "
                f"({growth * 1e9:.3g} ns a step per position of context, against {self.predicted * 1e9:.3g} ns)")

    def report(self, machine, threads: int) -> None:
        """Tell `machine` why its prediction did not hold, when it keeps such news (the CLI's
        profile does: env/machine.LazyProfile.saw; a profile in a test or a runner does not)
        and the machine is quiet but for this run's `threads`."""
        why, saw = self.verdict(), getattr(machine, "saw", None)
        if why is not None and saw is not None and self.quiet(threads):
            saw(why)


def quiet_beside(threads: int) -> bool:
    """The 1-minute load, less this run's own threads, under calibration's bar for busy."""
    try:
        load = os.getloadavg()[0]
    except OSError:
        return False  # unknown: not quiet
    return load - threads <= BUSY * (os.cpu_count() or 1)


def _low(values: list[float]) -> float:
    """A bucket's tenth percentile: near its best, past a lucky outlier."""
    ordered = sorted(values)
    return ordered[len(ordered) // 10]

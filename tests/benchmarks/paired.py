"""The one way a speed benchmark here compares two things: paired, alternating rounds.

A shared machine drifts (another tenant, a browser, turbo clocks), so a figure is never one
run. Each round measures both arms back to back, in an order swapped from round to round,
and keeps their ratio (`subject / reference`); the first `warmup` rounds are measured and
thrown away (caches, page faults, the calibration). The verdict comes from the ratios'
median and their interquartile range, the noise:

- **ok**: the whole range is on the target's good side;
- **missed**: the whole range is on its bad side;
- **inconclusive**: the target lies inside the range, after `max_rounds`: the machine is
  too noisy to say, which is said rather than passed or failed.

Rounds are added (up to `max_rounds`) while the target lies inside the range. The load
average before and after is reported beside every figure. `exit_code` gives 0 when every
comparison is ok, 1 when one missed, 3 when none missed but one was inconclusive.

    from benchmarks.paired import Comparison, compare, exit_code
    verdict = compare(Comparison("decode", lambda arm: measure(arm), target=1.0, lower_is_better=False))
"""

from __future__ import annotations

import os
import statistics
from dataclasses import dataclass, field
from typing import Callable

ARMS = ("reference", "subject")


@dataclass
class Comparison:
    """What to compare: `measure(arm)` gives one figure for "reference" or "subject" (a time,
    or a rate when `lower_is_better` is False); the target bounds subject / reference."""

    name: str
    measure: Callable[[str], float]
    target: float = 1.0
    lower_is_better: bool = True  # a time: the ratio must stay at or under the target
    rounds: int = 7
    warmup: int = 1
    max_rounds: int = 15
    unit: str = ""


@dataclass
class Verdict:
    name: str
    ratios: list[float]
    figures: dict[str, list[float]] = field(default_factory=dict)
    load: tuple[float | None, float | None] = (None, None)
    state: str = "inconclusive"
    target: float = 1.0
    lower_is_better: bool = True

    @property
    def median(self) -> float:
        return statistics.median(self.ratios)

    @property
    def spread(self) -> tuple[float, float]:
        """The ratios' interquartile range (the middle half of the rounds)."""
        if len(self.ratios) < 4:
            return min(self.ratios), max(self.ratios)
        q = statistics.quantiles(self.ratios, n=4, method="inclusive")
        return q[0], q[2]

    def line(self) -> str:
        low, high = self.spread
        sign = "<=" if self.lower_is_better else ">="
        loads = "/".join("?" if v is None else f"{v:.2f}" for v in self.load)
        return (f"{self.name}: subject/reference median {self.median:.3f}x (middle half {low:.3f}-{high:.3f}x, "
                f"{len(self.ratios)} rounds, load {loads}), target {sign} {self.target:.2f}x: {self.state.upper()}")


def judge(ratios: list[float], target: float, lower_is_better: bool) -> str:
    verdict = Verdict("", ratios, target=target, lower_is_better=lower_is_better)
    low, high = verdict.spread
    good_all, bad_all = (high <= target, low > target) if lower_is_better else (low >= target, high < target)
    return "ok" if good_all else "missed" if bad_all else "inconclusive"


def load_average() -> float | None:
    try:
        return os.getloadavg()[0]
    except OSError:
        return None


def compare(c: Comparison, echo: Callable[[str], None] = print) -> Verdict:
    """Run `c`'s rounds (alternating the arms' order) and judge them."""
    verdict = Verdict(c.name, [], {arm: [] for arm in ARMS}, target=c.target, lower_is_better=c.lower_is_better)
    before = load_average()
    done = 0
    while True:
        order = ARMS if done % 2 == 0 else ARMS[::-1]
        got = {arm: c.measure(arm) for arm in order}
        done += 1
        if done <= c.warmup:
            continue
        for arm in ARMS:
            verdict.figures[arm].append(got[arm])
        verdict.ratios.append(got["subject"] / got["reference"])
        echo(f"  {c.name} round {len(verdict.ratios)}: {got['reference']:.4g} -> {got['subject']:.4g}{c.unit} "
             f"({verdict.ratios[-1]:.3f}x)")
        if len(verdict.ratios) >= c.rounds:
            verdict.state = judge(verdict.ratios, c.target, c.lower_is_better)
            if verdict.state != "inconclusive" or len(verdict.ratios) >= c.max_rounds:
                break
    verdict.load = (before, load_average())
    echo(verdict.line())
    return verdict


def compare_two(c: Comparison, second: Comparison, echo: Callable[[str], None] = print) -> list[Verdict]:
    """Two figures from each measurement (a server round's throughput and its TTFT; a run's
    prefill and decode rates): `c.measure(arm)` gives both as a pair (see compare_many)."""
    return compare_many(c, [second], echo)


def compare_many(c: Comparison, more: list[Comparison], echo: Callable[[str], None] = print) -> list[Verdict]:
    """Several figures from each measurement: `c.measure(arm)` gives a tuple, `c`'s figure
    first and then one for each of `more`. The rounds are `c`'s; the other figures' ratios
    come from the very same rounds and are judged against their own targets (their own
    `measure` is unused)."""
    rest: dict[str, list[tuple[float, ...]]] = {arm: [] for arm in ARMS}

    def first(arm: str) -> float:
        one, *others = c.measure(arm)  # a tuple here
        rest[arm].append(tuple(others))
        return one

    verdict = compare(Comparison(c.name, first, c.target, c.lower_is_better, c.rounds, c.warmup, c.max_rounds,
                                 c.unit), echo)
    skip = len(rest["subject"]) - len(verdict.ratios)  # the warm-up rounds
    verdicts = [verdict]
    for i, other in enumerate(more):
        kept = {arm: [figures[i] for figures in v[skip:]] for arm, v in rest.items()}
        ratios = [s / r for s, r in zip(kept["subject"], kept["reference"])]
        verdicts.append(Verdict(other.name, ratios, kept, verdict.load,
                                judge(ratios, other.target, other.lower_is_better), other.target,
                                other.lower_is_better))
        echo(verdicts[-1].line())
    return verdicts


def exit_code(verdicts: list[Verdict]) -> int:
    states = {v.state for v in verdicts}
    return 1 if "missed" in states else 3 if "inconclusive" in states else 0

"""The paired-measurement harness every speed benchmark uses (tests/benchmarks/paired.py),
driven by made-up figures: alternating order, the warm-up thrown away, and the three
verdicts, with rounds added while the target lies inside the noise."""

from __future__ import annotations

import random

from benchmarks.paired import Comparison, compare, exit_code, judge


def figures(ratio: float, noise: float, seed: int = 1):
    """A measure whose subject is `ratio` times the reference, each figure off by up to
    `noise` (relative), and a log of the arms in the order they were measured."""
    rng, calls = random.Random(seed), []

    def measure(arm: str) -> float:
        calls.append(arm)
        base = 100.0 if arm == "reference" else 100.0 * ratio
        return base * (1 + rng.uniform(-noise, noise))
    return measure, calls


def quiet(line: str) -> None:
    pass


def test_a_clear_gain_is_ok_a_clear_loss_is_missed():
    measure, calls = figures(0.9, 0.02)
    v = compare(Comparison("faster", measure, target=1.0, rounds=5), echo=quiet)
    assert v.state == "ok" and len(v.ratios) == 5 and 0.85 < v.median < 0.95
    assert calls[:4] == ["reference", "subject", "subject", "reference"]  # the order swaps each round
    measure, _ = figures(1.1, 0.02)
    assert compare(Comparison("slower", measure, target=1.0, rounds=5), echo=quiet).state == "missed"
    # a rate: higher is better, so the same 1.1x passes a >= 1.0x target
    measure, _ = figures(1.1, 0.02)
    assert compare(Comparison("rate", measure, target=1.0, rounds=5, lower_is_better=False), echo=quiet).state == "ok"


def test_noise_wider_than_the_margin_adds_rounds_then_says_inconclusive():
    measure, _ = figures(1.0, 0.3)
    lines: list[str] = []
    v = compare(Comparison("noisy", measure, target=1.0, rounds=5, max_rounds=11), echo=lines.append)
    assert v.state == "inconclusive" and len(v.ratios) == 11
    assert "INCONCLUSIVE" in lines[-1] and "load" in lines[-1] and "middle half" in lines[-1]
    assert exit_code([v]) == 3


def test_the_warm_up_is_measured_and_thrown_away():
    measure, calls = figures(0.9, 0.0)
    first = [True]

    def cold(arm: str) -> float:
        if first[0]:  # the first figure of all: a cold cache, 50 times slower
            first[0] = False
            return 5000.0
        return measure(arm)
    v = compare(Comparison("warm", cold, target=1.0, rounds=3, warmup=1), echo=quiet)
    assert len(v.ratios) == 3 and all(abs(r - 0.9) < 1e-9 for r in v.ratios) and v.state == "ok"


def test_the_verdict_reads_the_middle_half_of_the_rounds():
    assert judge([0.9, 0.95, 0.97, 0.98, 2.5], 1.0, True) == "ok"  # one wild round does not decide
    assert judge([0.9, 0.95, 1.02, 1.05, 1.1], 1.0, True) == "inconclusive"
    assert exit_code([]) == 0


def test_two_figures_from_one_measurement_are_judged_on_the_same_rounds():
    from benchmarks.paired import compare_two

    rng, calls = random.Random(3), []

    def measure(arm: str) -> tuple[float, float]:  # a server round: (throughput, TTFT)
        calls.append(arm)
        faster = arm == "subject"
        return 110.0 * (1 + rng.uniform(-0.01, 0.01)) if faster else 100.0, 90.0 if faster else 100.0

    rate, ttft = compare_two(Comparison("aggregate", measure, target=1.0, lower_is_better=False, rounds=4),
                             Comparison("ttft", lambda arm: 0.0, target=1.0), echo=quiet)
    assert rate.state == ttft.state == "ok" and len(rate.ratios) == len(ttft.ratios) == 4
    assert len(calls) == 10  # one warm-up round and four counted, both arms each: the TTFTs came with them
    assert ttft.ratios == [0.9] * 4 and ttft.figures["subject"] == [90.0] * 4

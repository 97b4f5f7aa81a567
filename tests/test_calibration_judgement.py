"""How the calibration judges its flash-attention samples (runtime/calibration/flash.py and
machine.judged): the minimum of alternating rounds is the estimate and the second best's
excess the noise; a ratio no two kernels have is measured again, then dropped; and a context leaves
llama.cpp's default only where the other mode wins by more than the margin at its best and
at its second best. The samples here are the figures the issue met on a busy 2-core EPYC."""

from __future__ import annotations

import pytest

from tallow.models.memory import Shape
from tallow.runtime.calibration.flash import DEFAULT, MARGIN, choose, implausible, summarize
from tallow.runtime.calibration.machine import Profile, Workload, judged

SHAPE = Shape(30, 576, 9, 384, 49152, 8192, (1,) * 30, 1)  # the default model's
METRICS = ("decode_0", "prefill_0", "prefill_deep", "decode_deep")


def rounds(values: dict[str, float], slow: dict[str, list[float]] | None = None, n: int = 5) -> dict[str, list[float]]:
    """`n` samples of each measurement: its value, and the slower ones `slow` lists."""
    return {m: [values[m]] * (n - len((slow or {}).get(m, []))) + (slow or {}).get(m, []) for m in METRICS}


ON = {"decode_0": 0.5e-3, "prefill_0": 0.19e-3, "prefill_deep": 0.36e-3, "decode_deep": 1.0e-3}
OFF = {"decode_0": 0.55e-3, "prefill_0": 0.2e-3, "prefill_deep": 0.4e-3, "decode_deep": 1.1e-3}


def test_the_estimate_is_the_best_round_and_the_noise_is_the_second_best_above_it():
    samples = {"on": rounds(ON, {"decode_0": [0.6e-3, 50e-3, 90e-3, 40e-3]}), "off": rounds(OFF)}
    timings, spread = summarize(samples, 1088)
    assert timings["_depth"] == 1088 and timings["on"] == ON and timings["off"] == OFF
    assert spread["on"]["decode_0"] == pytest.approx(0.2)  # a busy machine's slow rounds do not count
    assert spread["off"] == dict.fromkeys(METRICS, 0.0)


def test_a_gap_no_kernel_pair_has_is_measured_again_then_dropped():
    busy = {**ON, "decode_deep": 0.130}  # the stored figure: 60x the other mode's 0.0022
    first = {"samples": {"on": rounds(busy), "off": rounds({**OFF, "decode_deep": 0.0022})}, "depth": 1088}
    assert "decode_deep" in implausible(summarize(first["samples"], 1088)[0])
    quiet = {"samples": {"on": rounds(ON), "off": rounds(OFF)}, "depth": 1088}
    timings, spread, why = judged(first, "", lambda: quiet)  # a second look, merged: kept
    assert why == "" and timings["on"]["decode_deep"] == ON["decode_deep"] and spread is not None
    timings, spread, why = judged(first, "", lambda: first)  # implausible twice: no timings, the default
    assert timings is None and spread is None and why.startswith("implausible timings after a second look")
    looks = []
    judged(quiet, "", lambda: looks.append(1))  # a plausible first look is not repeated
    assert looks == []
    assert judged(None, "died by SIGSEGV", lambda: quiet) == (None, None, "died by SIGSEGV")


def profile(on: dict, off: dict, spread: dict | None = None) -> Profile:
    return Profile("k", {}, [], True, "", False, {"on": on, "off": off, "_depth": 1088}, spread=spread)


def test_the_default_stands_unless_the_other_mode_wins_by_more_than_the_noise():
    long_chat = Workload(2000, 2000)
    # off a little cheaper (within the margin): llama.cpp's default
    slightly = {k: v * (1 - MARGIN / 2) for k, v in ON.items()}
    assert profile(ON, slightly).flash_attn_for(SHAPE, long_chat) == DEFAULT == "on"
    # off clearly cheaper deep, and quiet: off
    deep_win = {**ON, "decode_deep": ON["decode_deep"] * 3}
    assert profile(deep_win, ON).flash_attn_for(SHAPE, long_chat) == "off"
    # the same best rounds, but off's second best was five times as slow: too noisy to leave the default
    noisy = {"on": dict.fromkeys(METRICS, 0.0), "off": dict.fromkeys(METRICS, 4.0)}
    assert profile(deep_win, ON, noisy).flash_attn_for(SHAPE, long_chat) == "on"
    assert choose({"on": ON, "off": OFF, "_depth": 1088}, None, 1.0, 1.0, 100, 100) == "on"
    # measured while the machine was busy: kept, shown, not acted on
    busy = profile(deep_win, ON)
    busy.busy = True
    assert busy.flash_attn_for(SHAPE, long_chat) == DEFAULT
    # nothing measured: the default
    assert Profile("k", {}, [], True, "", False, None).flash_attn_for(SHAPE, long_chat) == DEFAULT

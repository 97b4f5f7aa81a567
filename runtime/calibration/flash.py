"""Flash attention on or off, judged from the calibration child's samples.

A shared machine only ever makes a measurement slower, so each measurement's minimum over
its rounds is the estimate, and how far its second best lies above it is the noise (the
median is no guide on a busy machine: there most rounds are slowed, some a hundredfold). Samples no
pair of kernels could produce (one mode many times the other's time on the same work: a
busy moment that fell on one mode's measurement) are not kept: the caller measures again,
and gives up on timings if they stay so. A context's choice departs from llama.cpp's own
default (on, where the CPU supports it) only when the other mode is cheaper by more than
MARGIN at its best and at its second best alike.
"""

from __future__ import annotations

PLAUSIBLE = 6.0  # the largest on/off ratio of one measurement that two kernels can have
MARGIN = 0.05  # how much cheaper the other mode must be, at its best and at its second best
DEFAULT = "on"  # llama.cpp's "auto" on a CPU backend that has flash attention


def summarize(samples: dict, depth: int) -> tuple[dict, dict]:
    """(timings, spread) from the child's samples: per mode and measurement, the minimum
    (seconds per token), and the second best's excess over it (0.1: 10% slower)."""
    timings: dict = {"_depth": depth}
    spread: dict = {}
    for mode, measured in samples.items():
        timings[mode] = {m: min(v) for m, v in measured.items()}
        spread[mode] = {m: round(sorted(v)[1] / min(v) - 1, 4) if len(v) > 1 else 0.0 for m, v in measured.items()}
    return timings, spread


def implausible(timings: dict) -> str:
    """Why these timings cannot be right ('' when they can): a measurement whose two modes
    differ by more than PLAUSIBLE times."""
    for m, on in timings["on"].items():
        off = timings["off"][m]
        ratio = max(on, off) / max(min(on, off), 1e-12)
        if ratio > PLAUSIBLE:
            return f"{m}: on {on * 1000:.3g} ms against off {off * 1000:.3g} ms a token ({ratio:.0f}x)"
    return ""


def merged(first: dict, second: dict) -> dict:
    """Two sets of samples as one (a second look after an implausible first)."""
    return {mode: {m: first[mode][m] + second[mode][m] for m in first[mode]} for mode in first}


def choose(timings: dict, spread: dict | None, layers: float, width: float, prompt: int, decode: int) -> str:
    """'on' or 'off' for a context that prefills `prompt` tokens and decodes `decode`, on a
    model `layers` times the calibration model's depth and `width` times its attention work."""
    depth = timings["_depth"]

    def cost(mode: str, second: bool) -> float:
        m = {k: v * (1 + (spread or {}).get(mode, {}).get(k, 0.0) * second) for k, v in timings[mode].items()}
        d_slope = (m["decode_deep"] - m["decode_0"]) / depth
        p_slope = (m["prefill_deep"] - m["prefill_0"]) / depth
        return (prompt * m["prefill_0"] * layers + p_slope * width * prompt * prompt / 2
                + decode * m["decode_0"] * layers + d_slope * width * decode * (prompt + decode / 2))

    other = "off" if DEFAULT == "on" else "on"
    if all(cost(other, second) < cost(DEFAULT, second) * (1 - MARGIN) for second in (False, True)):
        return other
    return DEFAULT

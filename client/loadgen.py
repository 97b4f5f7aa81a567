"""`tallow bench --endpoint URL`: a load generator for an OpenAI-compatible server.

Two ways to load it, as vLLM's `vllm bench serve` and genai-perf do: a fixed concurrency
(N clients, each sending its next request when the last one ends) or a Poisson arrival
rate (requests sent at exponential intervals whatever the server's state). Every point is
bounded, in requests and in seconds. Per request, measured here: TTFT, the gaps between
streamed chunks (ITL), time per output token after the first (TPOT), end-to-end latency.

Goodput (DistServe's measure): requests per second that met the SLO (TTFT and TPOT limits).
`goodput_search` finds the highest Poisson rate at which at least `attainment` of the
requests meet it: it doubles the rate from a start until the SLO breaks, then bisects
between the last rate that held and the first that did not; it stops after `max_points`
points in all, so it always ends.
"""

from __future__ import annotations

import itertools
import random
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from tallow.client.endpoint import Call, Endpoint, RemoteError
from tallow.runtime.types import FinalEvent, percentile

WORDS = ("time way year work day life world hand part child eye place week case point number group problem fact "
         "water home room area money story month night word side kind head house friend hour game line city name "
         "team minute idea body back parent face level door health art war history party result change morning "
         "reason research girl guy moment air teacher force education").split()


_SERIAL = itertools.count()  # synthetic prompts are numbered across points: none repeats, no cache serves one


@dataclass(frozen=True)
class Load:
    model: str
    input_tokens: int = 128  # synthetic prompts: about this many tokens (one common word each)
    output_tokens: int = 64  # max_tokens
    requests: int = 32  # per point
    max_seconds: float = 120.0  # per point: no new request after this
    ignore_eos: bool = False  # ask for exactly output_tokens (vLLM, llama.cpp and tallow take it)
    prompts: tuple[dict[str, Any], ...] = ()  # bodies from a JSONL file, used in turn, instead of synthetic ones
    seed: int = 0


@dataclass(frozen=True)
class SLO:
    ttft_ms: float
    tpot_ms: float
    attainment: float = 0.9  # the share of requests that must meet both


@dataclass
class Sample:
    ttft_ms: float = 0.0
    tpot_ms: float = 0.0
    e2e_ms: float = 0.0
    itl_ms: list[float] = field(default_factory=list)
    output_tokens: int = 0
    prompt_tokens: int | None = None
    error: str | None = None


@dataclass
class Point:
    mode: str  # "concurrency" | "rate"
    value: float
    samples: list[Sample]
    duration_s: float

    @property
    def ok(self) -> list[Sample]:
        return [s for s in self.samples if s.error is None]

    def meets(self, slo: SLO) -> int:
        return sum(1 for s in self.ok if s.ttft_ms <= slo.ttft_ms and s.tpot_ms <= slo.tpot_ms)

    def holds(self, slo: SLO) -> bool:
        return bool(self.samples) and self.meets(slo) >= slo.attainment * len(self.samples)

    def summary(self, slo: SLO | None = None) -> dict[str, Any]:
        ok = self.ok
        d = self.duration_s or 1e-9
        prompts = [s.prompt_tokens for s in ok if s.prompt_tokens is not None]
        out: dict[str, Any] = {
            "mode": self.mode, "value": self.value, "requests": len(self.samples), "completed": len(ok),
            "failed": len(self.samples) - len(ok), "duration_s": round(self.duration_s, 3),
            "request_throughput": round(len(ok) / d, 3),
            "output_throughput": round(sum(s.output_tokens for s in ok) / d, 2),
            "mean_prompt_tokens": round(sum(prompts) / len(prompts), 1) if prompts else None,
            "mean_output_tokens": round(sum(s.output_tokens for s in ok) / len(ok), 1) if ok else 0,
        }
        itl = [g for s in ok for g in s.itl_ms]
        for name, values in (("ttft_ms", [s.ttft_ms for s in ok]), ("tpot_ms", [s.tpot_ms for s in ok]),
                             ("itl_ms", itl), ("e2e_ms", [s.e2e_ms for s in ok])):
            for q in (50, 90, 99):
                out[f"{name}_p{q}"] = round(percentile(values, q), 2)
        if slo is not None:
            out["slo_attainment"] = round(self.meets(slo) / len(self.samples), 3) if self.samples else 0.0
            out["goodput"] = round(self.meets(slo) / d, 3)
        errors = sorted({s.error for s in self.samples if s.error})
        if errors:
            out["errors"] = errors[:3]
        return out


def body_for(load: Load, i: int) -> tuple[str, dict[str, Any]]:
    """(path, body) of request i: the i-th file prompt in turn, or a synthetic one of its own
    words (so that no two share a prefix a cache could serve: i is never the same twice)."""
    if load.prompts:
        body = dict(load.prompts[i % len(load.prompts)])
        path = "/chat/completions" if "messages" in body else "/completions"
    else:
        rng = random.Random(load.seed * 1_000_003 + i)
        text = " ".join(rng.choice(WORDS) for _ in range(max(1, load.input_tokens - 8)))
        body = {"messages": [{"role": "user", "content": text}]}
        path = "/chat/completions"
    body = {"model": load.model, "max_tokens": load.output_tokens, "temperature": 0, **body}
    if load.ignore_eos:
        body["ignore_eos"] = True
    return path, body


def one(endpoint: Endpoint, load: Load, i: int, timeout: float) -> Sample:
    path, body = body_for(load, i)
    started = time.perf_counter()
    try:
        final = None
        for event in Call(endpoint, path, body, timeout).events():
            final = event
    except RemoteError as exc:
        return Sample(e2e_ms=(time.perf_counter() - started) * 1000, error=exc.message)
    if not isinstance(final, FinalEvent):
        return Sample(e2e_ms=(time.perf_counter() - started) * 1000, error="the stream ended without its usage")
    t, u = final.timings, final.usage
    n = u.completion_tokens
    tpot = (t.total_ms - t.ttft_ms) / (n - 1) if n > 1 else 0.0
    return Sample(t.ttft_ms, tpot, t.total_ms, list(t.itl_ms), n, u.prompt_tokens)


def run_point(endpoint: Endpoint, load: Load, mode: str, value: float,
              stop: Callable[[], bool] = lambda: False) -> Point:
    """One point: `value` clients at once ("concurrency"), or `value` requests a second
    arriving as a Poisson process ("rate"); `load.requests` requests, none sent after
    `load.max_seconds` (those are not counted), each bounded by the same time."""
    samples: list[Sample] = []
    lock = threading.Lock()
    started = time.perf_counter()
    deadline = started + load.max_seconds
    timeout = max(1.0, load.max_seconds)
    counter = iter(range(load.requests))

    def take() -> int | None:
        with lock:
            if stop() or time.perf_counter() >= deadline or next(counter, None) is None:
                return None
            return next(_SERIAL)

    def record(sample: Sample) -> None:
        with lock:
            samples.append(sample)

    threads: list[threading.Thread] = []
    if mode == "concurrency":
        def client() -> None:
            while (i := take()) is not None:
                record(one(endpoint, load, i, timeout))

        threads = [threading.Thread(target=client, daemon=True) for _ in range(int(value))]
        for t in threads:
            t.start()
    else:
        rng = random.Random(load.seed)
        when = started
        while (i := take()) is not None:
            when += rng.expovariate(value)
            pause = when - time.perf_counter()
            if pause > 0:
                time.sleep(min(pause, max(0.0, deadline - time.perf_counter())))
            if time.perf_counter() >= deadline:
                break
            t = threading.Thread(target=lambda i=i: record(one(endpoint, load, i, timeout)), daemon=True)
            t.start()
            threads.append(t)
    for t in threads:
        t.join(max(0.0, deadline + timeout - time.perf_counter()))
    return Point(mode, value, list(samples), time.perf_counter() - started)


def goodput_search(endpoint: Endpoint, load: Load, slo: SLO, start_rate: float, max_points: int = 8,
                   on_point: Callable[[Point], None] = lambda p: None) -> tuple[list[Point], float | None]:
    """(every point measured, the highest rate that held or None): doubling from `start_rate`,
    then bisecting; at most `max_points` points."""
    points: list[Point] = []
    good, bad = None, None
    rate = start_rate
    while len(points) < max_points:
        point = run_point(endpoint, load, "rate", round(rate, 3))
        points.append(point)
        on_point(point)
        if point.holds(slo):
            good = rate
        else:
            bad = rate
        if bad is None:
            rate *= 2
        elif good is None:
            if rate < start_rate / 16:  # not even a trickle meets it
                break
            rate /= 2
        elif bad / good <= 1.15:  # close enough: within 15%
            break
        else:
            rate = (good + bad) / 2
    return points, good

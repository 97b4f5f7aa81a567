"""llama-bench's tests, measured through tallow's engine, against this machine's limit.

pp<N>: prefill N tokens; tg<N>: decode N tokens one at a time; pg<P>,<N>: both; each at an
optional depth (tokens already in the KV cache). Random token ids, the same ones for every
repetition; one warm-up run excluded; the KV cache cleared before each repetition and
refilled to the depth (untimed). The ceiling: decode must read every weight it uses and
the KV cache once per token, so memory bandwidth / bytes per token bounds decode tok/s.
"""

from __future__ import annotations

import random
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

RAPL = Path("/sys/class/powercap/intel-rapl:0/energy_uj")


@dataclass(frozen=True)
class BenchTest:
    n_prompt: int
    n_gen: int
    n_depth: int = 0

    @property
    def name(self) -> str:
        base = f"pp{self.n_prompt}" if not self.n_gen else (f"tg{self.n_gen}" if not self.n_prompt
                                                               else f"pp{self.n_prompt}+tg{self.n_gen}")
        return base + (f" @ d{self.n_depth}" if self.n_depth else "")


@dataclass
class BenchResult:
    test: BenchTest
    samples_ns: list[int]
    ttft_ms: list[float] = field(default_factory=list)
    joules: list[float] = field(default_factory=list)
    peak_rss: int = 0  # the largest resident size seen at the end of a repetition

    @property
    def tokens(self) -> int:
        return self.test.n_prompt + self.test.n_gen

    @property
    def samples_ts(self) -> list[float]:
        return [self.tokens / (ns / 1e9) for ns in self.samples_ns]


def memory_bandwidth(size_mb: int = 512, reps: int = 5) -> float:
    """Bytes per second of a streaming read over a buffer many times the last-level cache."""
    import numpy as np

    buf = np.ones(size_mb * (1 << 20) // 8, dtype=np.float64)
    best = float("inf")
    for _ in range(reps):
        started = time.perf_counter()
        buf.sum()
        best = min(best, time.perf_counter() - started)
    return buf.nbytes / best


def bytes_per_token(gguf_info, n_ctx_depth: int, type_k: str = "f16", type_v: str = "f16") -> int:
    """Weights one decoded token reads, plus the KV cache at that depth."""
    from tallow.models.memory import Shape, kv_cache_bytes

    names = {t.name: t for t in gguf_info.tensors}
    weights = sum(t.n_bytes for t in gguf_info.tensors)
    emb = names.get("token_embd.weight")
    if emb is not None and "output.weight" in names:
        weights -= emb.n_bytes - emb.n_bytes // max(1, emb.shape[1])  # a lookup reads one row
    return int(weights + kv_cache_bytes(Shape.from_gguf([gguf_info]), n_ctx_depth, type_k, type_v))


def _energy() -> float | None:
    try:
        return int(RAPL.read_text()) / 1e6
    except (OSError, ValueError):
        return None


def energy_available() -> bool:
    return _energy() is not None


def rss_bytes() -> int:
    """Resident memory now (the bandwidth probe's buffer is freed by then, so it does not count)."""
    import psutil

    return psutil.Process().memory_info().rss


def run_test(engine, test: BenchTest, reps: int, on_rep: Callable[[int], None] | None = None) -> BenchResult:
    """Time `reps` repetitions of one test (after an untimed warm-up)."""
    from tallow.runtime.backend.sampler import Sampler
    from tallow.runtime.types import SamplerParams

    rng = random.Random(42)
    vocab = engine.model.n_vocab
    tokens = [rng.randrange(vocab) for _ in range(test.n_depth + test.n_prompt + test.n_gen + 1)]
    depth, prompt = tokens[:test.n_depth], tokens[test.n_depth:test.n_depth + test.n_prompt]
    gen = tokens[test.n_depth + test.n_prompt:]
    if test.n_depth + test.n_prompt + test.n_gen > engine.n_ctx:
        raise ValueError(f"{test.name} needs {test.n_depth + test.n_prompt + test.n_gen} tokens of context; "
                         f"the context holds {engine.n_ctx}")
    sampler = Sampler(engine.model, SamplerParams(0.0, 0, 1.0, 0.0, 1.0, 64, 0))
    result = BenchResult(test, [])
    ctx, nb = engine.ctx, engine.n_batch
    try:
        for rep in range(reps + 1):  # repetition 0 is the warm-up
            engine.reset()
            for i in range(0, len(depth), nb):
                ctx.decode(depth[i:i + nb], i, 0, want_last_logits=False)
            joules0 = _energy()
            started = time.perf_counter_ns()
            pos = len(depth)
            for i in range(0, len(prompt), nb):
                chunk = prompt[i:i + nb]
                ctx.decode(chunk, pos, 0, want_last_logits=i + nb >= len(prompt))
                pos += len(chunk)
            ttft = None
            if prompt:
                sampler.sample(ctx, -1)
                ttft = (time.perf_counter_ns() - started) / 1e6
            for t in gen[:test.n_gen]:
                ctx.decode([t], pos, 0)
                pos += 1
            elapsed = time.perf_counter_ns() - started
            joules1 = _energy()
            if rep == 0:
                continue
            result.samples_ns.append(elapsed)
            result.peak_rss = max(result.peak_rss, rss_bytes())
            if ttft is not None:
                result.ttft_ms.append(ttft)
            if joules0 is not None and joules1 is not None and joules1 >= joules0:
                result.joules.append(joules1 - joules0)
            if on_rep:
                on_rep(rep)
    finally:
        sampler.close()
        engine.reset()
    return result


def summarize(result: BenchResult) -> dict:
    ns, ts = result.samples_ns, result.samples_ts
    sd = statistics.stdev
    return {
        "avg_ns": int(statistics.mean(ns)), "stddev_ns": int(sd(ns)) if len(ns) > 1 else 0,
        "avg_ts": statistics.mean(ts), "stddev_ts": sd(ts) if len(ts) > 1 else 0.0,
        "samples_ns": ns, "samples_ts": ts,
        "ttft_ms": statistics.mean(result.ttft_ms) if result.ttft_ms else None,
        "joules_per_token": statistics.mean(result.joules) / result.tokens if result.joules else None,
        "peak_memory_bytes": result.peak_rss,
    }


@dataclass
class ParallelResult:
    n_parallel: int
    n_prompt: int
    n_gen: int
    ttft_ms: list[float]  # every request's, from its submission
    itl_ms: list[float]  # every gap between two tokens of one request
    decode_s: list[float]  # per repetition: from when every request is decoding to the last token
    decode_tokens: list[int]  # ... and the tokens produced in that time

    @property
    def ttft_p50(self) -> float:
        return statistics.median(self.ttft_ms)

    @property
    def itl_p50(self) -> float:
        return statistics.median(self.itl_ms)

    @property
    def samples_ts(self) -> list[float]:
        return [n / s for n, s in zip(self.decode_tokens, self.decode_s)]


def run_parallel(scheduler, n_prompt: int, n_gen: int, reps: int) -> ParallelResult:
    """N requests submitted together to the scheduler that serve and batch use: their prompts
    prefilled in shared batches, then a batch per step with the next token of each. Timings
    are the requests' own (runtime/sequence.py), so these are the figures of the product."""
    from tallow.runtime.types import Request, Sampling

    n = len(scheduler.slots)
    rng = random.Random(7)
    vocab = scheduler.engine.model.n_vocab
    result = ParallelResult(n, n_prompt, n_gen, [], [], [], [])
    for rep in range(reps + 1):  # repetition 0 is the warm-up
        prompts = [[rng.randrange(vocab) for _ in range(n_prompt)] for _ in range(n)]  # no prefix reuse
        handles = [scheduler.submit(Request(p, n_gen, (), Sampling(temperature=0.0), ignore_eos=True, disk_cache=False))
                   for p in prompts]
        finals = [h.result() for h in handles]
        if rep == 0:
            continue
        # token times from submission (all submitted at once): the first, then each gap
        times = [[f.timings.ttft_ms] for f in finals]
        for t, f in zip(times, finals):
            for gap in f.timings.itl_ms:
                t.append(t[-1] + gap)
        everyone = max(t[0] for t in times)  # from here on, every request is decoding
        end = max(t[-1] for t in times)
        result.decode_tokens.append(sum(1 for t in times for x in t if x > everyone))
        result.decode_s.append((end - everyone) / 1000)
        result.ttft_ms += [f.timings.ttft_ms for f in finals]
        result.itl_ms += [g for f in finals for g in f.timings.itl_ms]
    return result


SLO = {"interactive": (500.0, 30.0), "server": (2000.0, 100.0)}  # (TTFT ms, ms per token): MLPerf, small models

"""Fair admission between API keys: one key floods, another sends one request at a time.

On the default model, one scheduler with 4 slots (what a runner of `tallow serve` uses):
key A submits 40 requests at once (64-token prompts, 64 new tokens, end-of-generation
banned); key B sends requests one after the other (each when the previous has finished)
for as long as A's flood lasts. Measured, alternating round by round:
  idle  8 of B's requests alone on the scheduler: its TTFT with nobody else there
  fcfs  the flood and B with no tenants (first come, first served: what tallow did before)
  fair  the same, A and B as two tenants (runtime/scheduling/admission.py)
Reported: B's median TTFT in each, how many requests B got in during the flood, and the
aggregate decode throughput (all tokens of A and B over the time from the first submission
to the last token).

Targets: fair B median TTFT <= 2 x idle; fair throughput >= 0.95 x fcfs. Exits 1 when one is missed.

    python tests/benchmarks/fairness.py [--model PATH] [--rounds 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.overhead import default_model  # noqa: E402

N_FLOOD, N_B, N_PROMPT, N_GEN, SLOTS = 40, 8, 64, 64, 4
TTFT_TARGET, THROUGHPUT_TARGET = 2.0, 0.95


def prompts(sched, n: int, tag: str) -> list[list[int]]:
    words = "the quick brown fox jumps over a lazy dog while seven bright stars rise".split()
    out = []
    for i in range(n):
        text = " ".join(words[(i + k) % len(words)] for k in range(N_PROMPT)) + f" {tag}{i}"
        out.append(sched.engine.model.tokenize(text, True, False)[:N_PROMPT])
    return out


def run(sched, flood: int, tenants: tuple[str | None, str | None]) -> tuple[list[float], float]:
    """(B's TTFTs in seconds, aggregate tok/s). B sends one request at a time: while A's
    flood lasts (its TTFTs are those of requests sent with A's requests in flight), or N_B
    requests on an idle scheduler."""
    from tallow.runtime.types import FinalEvent, Request, Sampling, TokenEvent

    base = Request([], N_GEN, sampling=Sampling(temperature=0), ignore_eos=True)
    finished_a = [0]
    last = [0.0]
    lock = threading.Lock()

    def on_event(ev) -> None:
        if isinstance(ev, FinalEvent):
            with lock:
                finished_a[0] += 1
                last[0] = max(last[0], time.perf_counter())

    start = time.perf_counter()
    for p in prompts(sched, flood, "a"):
        sched.submit(replace(base, prompt_tokens=p, tenant=tenants[0]), on_event)
    ttfts, sent = [], 0
    b_prompts = prompts(sched, 200, "b")
    while (finished_a[0] < flood) if flood else sent < N_B:
        first, finished = [], threading.Event()

        def on_b(ev, first=first, finished=finished) -> None:
            if isinstance(ev, TokenEvent) and not first:
                first.append(time.perf_counter())
            elif isinstance(ev, FinalEvent):
                last[0] = max(last[0], time.perf_counter())
                finished.set()
        asked = time.perf_counter()
        sched.submit(replace(base, prompt_tokens=b_prompts[sent % len(b_prompts)], tenant=tenants[1]), on_b)
        sent += 1
        finished.wait(600)
        ttfts.append(first[0] - asked)
    return ttfts, (flood + sent) * N_GEN / (last[0] - start)


def main() -> int:
    from tallow.runtime.scheduling.scheduler import Scheduler
    from tallow.runtime.types import LoadSettings, SchedulerSettings

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, default=None)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    model = args.model or default_model()
    sched = Scheduler.load([model], LoadSettings(n_ctx=SLOTS * 256, n_threads=2),
                           SchedulerSettings(parallel=SLOTS, max_queue=N_FLOOD + N_B))
    results: dict[str, list[tuple[list[float], float]]] = {"idle": [], "fcfs": [], "fair": []}
    try:
        run(sched, 4, ("a", "b"))  # warm up
        for r in range(args.rounds):
            for mode in (("idle", "fcfs", "fair") if r % 2 == 0 else ("fair", "fcfs", "idle")):
                flood, tenants = (0, ("a", "b")) if mode == "idle" else (N_FLOOD, (None, None) if mode == "fcfs"
                                                                         else ("a", "b"))
                results[mode].append(run(sched, flood, tenants))
                b, tps = results[mode][-1]
                print(f"round {r + 1} {mode}: B median TTFT {statistics.median(b) * 1000:.0f} ms over {len(b)} "
                      f"requests, {tps:.1f} tok/s", flush=True)
    finally:
        sched.close()
    ttft = {m: statistics.median(t for ts, _ in v for t in ts) for m, v in results.items()}
    tps = {m: statistics.median(x for _, x in v) for m, v in results.items() if m != "idle"}
    ratio_ttft, ratio_tps = ttft["fair"] / ttft["idle"], tps["fair"] / tps["fcfs"]
    print(f"B's median TTFT: idle {ttft['idle'] * 1000:.0f} ms, fcfs {ttft['fcfs'] * 1000:.0f} ms "
          f"({ttft['fcfs'] / ttft['idle']:.1f}x), fair {ttft['fair'] * 1000:.0f} ms ({ratio_ttft:.2f}x; target <= "
          f"{TTFT_TARGET}x)")
    print(f"aggregate: fcfs {tps['fcfs']:.1f} tok/s, fair {tps['fair']:.1f} tok/s ({ratio_tps:.3f}x; target >= "
          f"{THROUGHPUT_TARGET}x)")
    missed = [n for n, ok in (("TTFT", ratio_ttft <= TTFT_TARGET), ("throughput", ratio_tps >= THROUGHPUT_TARGET))
              if not ok]
    if missed:
        print("missed: " + ", ".join(missed))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

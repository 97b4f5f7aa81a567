"""What mixing LoRA adapter sets costs: llama.cpp applies adapters to a whole context, so the
scheduler decodes one set per step and requests of different sets take turns.

On the default model with a rank-16 adapter on every layer's Q and V (random, written here
with gguf), N requests (64-token prompts, 64 new tokens, end-of-generation banned) are
submitted together to one scheduler, in three arrangements:
  same   all N with the adapter (one set: one decode call a step)
  mixed  N/2 with it and N/2 without (two sets: they take turns, step by step)
  halves the N/2 with it, then the N/2 without, one group after the other
Aggregate decode tok/s = N x 63 / (last token - first decode token). Paired, alternating
rounds (tests/benchmarks/paired.py): mixed against halves, the verdict; mixed against same,
what mixing costs (no target).

Target: mixed >= 0.9 x halves (taking turns costs no more than running the groups apart:
nothing is lost to the switching itself). Exits 1 when missed, 3 when the machine was too
noisy to say.

    python tests/benchmarks/lora_mix.py [--model PATH] [--n 8] [--rounds 5]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from helpers.adapter import write_adapter  # noqa: E402

from benchmarks.overhead import default_model  # noqa: E402

TARGET = 0.9
N_PROMPT, N_GEN, RANK = 64, 64, 16


def adapter_for(model: Path, out: Path) -> Path:
    from tallow.models.gguf_file import read_gguf

    info = read_gguf(model)
    shapes = {t.name: t.shape for t in info.tensors}
    rng = np.random.default_rng(1)
    pairs = {}
    for name, (n_in, n_out) in ((n, s[:2]) for n, s in shapes.items() if n.endswith(("attn_q.weight", "attn_v.weight"))):
        pairs[name] = (rng.standard_normal((RANK, n_in)).astype(np.float32) * 0.01,
                       rng.standard_normal((n_out, RANK)).astype(np.float32) * 0.01)
    return write_adapter(out, info.architecture or "llama", pairs, alpha=RANK)


def run(sched, prompts: list[list[int]], sets: list[tuple[float, ...]]) -> float:
    """Aggregate decode tok/s of these requests, submitted together."""
    from tallow.runtime.types import Request, Sampling, TokenEvent

    times: list[list[float]] = [[] for _ in prompts]
    done = threading.Semaphore(0)

    def on_event(i):
        def record(ev):
            if isinstance(ev, TokenEvent):
                times[i].append(time.perf_counter())
            else:
                done.release()
        return record

    for i, (p, lora) in enumerate(zip(prompts, sets)):
        sched.submit(Request(p, N_GEN, sampling=Sampling(temperature=0), ignore_eos=True, lora=lora),
                     on_event=on_event(i))
    for _ in prompts:
        done.acquire()
    assert all(len(t) == N_GEN for t in times), [len(t) for t in times]
    start, end = max(t[0] for t in times), max(t[-1] for t in times)
    return len(prompts) * (N_GEN - 1) / (end - start)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    from benchmarks.paired import Comparison, compare, exit_code
    from tallow.runtime.scheduling.scheduler import Scheduler
    from tallow.runtime.types import LoadSettings, LoraSpec, SchedulerSettings

    model = args.model or default_model()
    n, half = args.n, args.n // 2
    on, off = (1.0,), (0.0,)
    rng = np.random.default_rng(2)

    def prompts() -> list[list[int]]:
        return [[int(t) for t in rng.integers(100, 20000, N_PROMPT)] for _ in range(n)]

    with tempfile.TemporaryDirectory() as d:
        lora = adapter_for(model, Path(d) / "lora.gguf")
        sched = Scheduler.load([model], LoadSettings(n_ctx=n * (N_PROMPT + N_GEN + 16), loras=(LoraSpec(lora),)),
                               SchedulerSettings(parallel=n))

        def arrangement(name: str) -> float:
            asked = prompts()
            if name == "same":
                return run(sched, asked, [on] * n)
            if name == "mixed":
                return run(sched, asked, [on, off] * half)
            a, b = run(sched, asked[:half], [on] * half), run(sched, asked[half:], [off] * half)
            return n * (N_GEN - 1) / (half * (N_GEN - 1) / a + half * (N_GEN - 1) / b)  # both groups' time, as one

        try:
            verdict = compare(Comparison("mixed / halves", lambda arm: arrangement("mixed" if arm == "subject" else
                                                                                   "halves"),
                                         TARGET, False, args.rounds, unit=" tok/s"))
            compare(Comparison("mixed / same (what mixing two sets costs)",
                               lambda arm: arrangement("mixed" if arm == "subject" else "same"), 0.0, False,
                               args.rounds, max_rounds=args.rounds, unit=" tok/s"))
        finally:
            sched.close()
    return exit_code([verdict])

if __name__ == "__main__":
    sys.exit(main())

"""What mixing LoRA adapter sets costs: llama.cpp applies adapters to a whole context, so the
scheduler decodes one set per step and requests of different sets take turns.

On the default model with a rank-16 adapter on every layer's Q and V (random, written here
with gguf), N requests (64-token prompts, 64 new tokens, end-of-generation banned) are
submitted together to one scheduler, in three arrangements, alternated round by round:
  same   all N with the adapter (one set: one decode call a step)
  mixed  N/2 with it and N/2 without (two sets: they take turns, step by step)
  halves the N/2 with it, then the N/2 without, one group after the other
Aggregate decode tok/s = N x 63 / (last token - first decode token), the median over rounds.

Target: mixed >= 0.9 x halves (taking turns costs no more than running the groups apart:
nothing is lost to the switching itself); the ratio mixed / same is what mixing costs.

    python tests/benchmarks/lora_mix.py [--model PATH] [--n 8] [--rounds 3]
"""

from __future__ import annotations

import argparse
import statistics
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
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    from tallow.runtime.scheduling.scheduler import Scheduler
    from tallow.runtime.types import LoadSettings, LoraSpec, SchedulerSettings

    model = args.model or default_model()
    n, half = args.n, args.n // 2
    with tempfile.TemporaryDirectory() as d:
        lora = adapter_for(model, Path(d) / "lora.gguf")
        sched = Scheduler.load([model], LoadSettings(n_ctx=n * (N_PROMPT + N_GEN + 16), loras=(LoraSpec(lora),)),
                               SchedulerSettings(parallel=n))
        rng = np.random.default_rng(2)
        figures: dict[str, list[float]] = {"same": [], "mixed": [], "halves": []}
        try:
            for r in range(args.rounds):
                prompts = [[int(t) for t in rng.integers(100, 20000, N_PROMPT)] for _ in range(n)]
                on, off = (1.0,), (0.0,)
                order = ["same", "mixed", "halves"] if r % 2 == 0 else ["halves", "mixed", "same"]
                for arrangement in order:
                    if arrangement == "same":
                        figures["same"].append(run(sched, prompts, [on] * n))
                    elif arrangement == "mixed":
                        figures["mixed"].append(run(sched, prompts, [on, off] * half))
                    else:  # one group, then the other: the time of both, as one figure
                        a, b = run(sched, prompts[:half], [on] * half), run(sched, prompts[half:], [off] * half)
                        figures["halves"].append(n * (N_GEN - 1) / (half * (N_GEN - 1) / a + half * (N_GEN - 1) / b))
        finally:
            sched.close()
    med = {k: statistics.median(v) for k, v in figures.items()}
    for k, v in figures.items():
        print(f"{k:<7} {med[k]:7.1f} tok/s  (rounds: {', '.join(f'{x:.1f}' for x in v)})")
    ratio = med["mixed"] / med["halves"]
    print(f"mixed / same {med['mixed'] / med['same']:.2f}x (what mixing two sets costs); "
          f"mixed / halves {ratio:.2f}x (target >= {TARGET})")
    return 0 if ratio >= TARGET else 1


if __name__ == "__main__":
    sys.exit(main())

"""Decode on a busy machine: tallow's thread choice against fixed thread counts.

Each measurement starts `tallow run` processes the way a user would (no --threads, the
default model, 256 new tokens, greedy) and reads their decode tok/s from --json:

1. one alone;
2. two at once: aggregate decode (the sum of both) against one alone. Target >= 1.0x
   (llama.cpp's defaults give about 0.46x on a 2-vCPU machine: each takes every core);
   the same pair pinned to a thread per core (-t CORES, llama.cpp's default) is printed
   beside it (once, 32 tokens: it is that slow);
3. one next to a CPU-bound stranger (a busy loop): against the best fixed thread count
   for that situation (each -t from 1 to the core count, measured once the same way to
   find it). Target >= 0.9x.

2 and 3 are paired, alternating rounds (tests/benchmarks/paired.py). Exits 1 when a target
is missed, 3 when the machine was too noisy to say.

    python tests/benchmarks/busy.py [--reps 5]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

PROMPT = "Count from 1 to 300, separated by commas."


def _rates(procs) -> list[float]:
    rates = []
    for p in procs:
        out, err = p.communicate(timeout=600)
        if p.returncode != 0:
            sys.exit(f"tallow run failed: {err.decode()[-400:]}")
        t = json.loads(out)["timings"]
        rates.append(t["decode_tokens"] / (t["decode_ms"] / 1000))
    return rates


def together(env, n: int, threads: int | None = None, tokens: int = 256) -> list[float]:
    from benchmarks.llamabench import tallow

    args = ["run", "smollm2:135m", PROMPT, "-n", str(tokens), "--temperature", "0", "--json", "--no-cache"]
    if threads:
        args += ["-t", str(threads)]
    return _rates([tallow(args, env) for _ in range(n)])


def with_stranger(env, threads: int | None) -> float:
    stranger = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        return together(env, 1, threads)[0]
    finally:
        stranger.kill()
        stranger.wait()


def main() -> int:
    from helpers.processes import shared_home

    from benchmarks.llamabench import tallow_env
    from benchmarks.paired import Comparison, compare, exit_code
    from tallow.runtime.host.threads import physical_cores

    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    home = shared_home()
    env = tallow_env(home, TALLOW_MACHINE_CACHE=str(home / "machine.json"))
    cores = physical_cores()
    together(env, 1)  # calibrate and warm the page cache first
    print(f"{cores} cores, default model, 256 tokens")
    verdicts = [compare(Comparison("two at once (tallow's choice), aggregate / one alone",
                                   lambda arm: sum(together(env, 2)) if arm == "subject" else together(env, 1)[0],
                                   1.0, False, args.reps, unit=" tok/s"))]
    pinned_pair = sum(together(env, 2, cores, tokens=32))  # a reference only, and slow: once, 32 tokens
    print(f"two at once, -t {cores} each (llama.cpp's default thread count): {pinned_pair:.1f} tok/s in all")
    fixed = {t: with_stranger(env, t) for t in range(1, cores + 1)}
    best_t = max(fixed, key=fixed.get)
    print("next to a busy loop, fixed thread counts: " + ", ".join(f"-t {t}: {r:.1f}" for t, r in fixed.items()))
    verdicts.append(compare(Comparison(f"next to a busy loop, tallow's choice / -t {best_t} (the best fixed count)",
                                       lambda arm: with_stranger(env, None if arm == "subject" else best_t), 0.9,
                                       False, args.reps, unit=" tok/s")))
    return exit_code(verdicts)

if __name__ == "__main__":
    sys.exit(main())

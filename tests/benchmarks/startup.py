"""Startup time: `tallow --help`, `tallow list` and completing a model name.

Each is run as a fresh process, as a shell runs it (median of --reps). Target: each under
0.3 s of wall time on this machine. Over it, the import-time breakdown of the slowest
(`python -X importtime`) is printed, heaviest first.

    python tests/benchmarks/startup.py [--reps 7]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TARGET_S = 0.3


def timed(args: list[str], env: dict[str, str]) -> float:
    started = time.perf_counter()
    subprocess.run(args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    return time.perf_counter() - started


def importtime(args: list[str], env: dict[str, str], top: int = 12) -> str:
    r = subprocess.run([sys.executable, "-X", "importtime", *args[1:]], env=env, capture_output=True, text=True)
    rows = []
    for line in r.stderr.splitlines():
        if line.startswith("import time:") and "|" in line and "cumulative" not in line:
            _, cumulative, name = line.split("|")
            rows.append((int(cumulative), name.rstrip()))
    rows.sort(reverse=True)
    return "\n".join(f"  {us / 1000:7.1f} ms  {name}" for us, name in rows[:top])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=7)
    args = ap.parse_args()
    exe = [sys.executable, "-m", "tallow.cli"]
    home = Path(tempfile.mkdtemp(prefix="tallow-startup-"))
    base = {k: v for k, v in os.environ.items() if not k.startswith(("TALLOW_", "_TALLOW", "COMP_"))}
    base["TALLOW_HOME"] = str(home)
    complete_env = {**base, "_TALLOW_COMPLETE": "complete_bash", "COMP_WORDS": "tallow run sm", "COMP_CWORD": "2"}
    cases = {
        "tallow --help": (exe + ["--help"], base),
        "tallow list": (exe + ["list"], base),
        "complete 'tallow run sm'": (exe, complete_env),
        "python -c pass (floor)": ([sys.executable, "-c", "pass"], base),
    }
    for argv, env in cases.values():  # warm the page cache
        timed(argv, env)
    results = {}
    for _ in range(args.reps):  # interleaved, so drift hits every case alike
        for label, (argv, env) in cases.items():
            results.setdefault(label, []).append(timed(argv, env))
    print(f"median of {args.reps}, fresh processes:")
    for label, samples in results.items():
        med = statistics.median(samples)
        mark = "" if "floor" in label else ("  ok" if med < TARGET_S else f"  OVER {TARGET_S} s")
        print(f"  {label:<28} {med * 1000:7.1f} ms{mark}")
    slow = [label for label, s in results.items() if "floor" not in label and statistics.median(s) >= TARGET_S]
    for label in slow:
        argv, env = cases[label]
        print(f"\nimport time of {label}, heaviest first (cumulative):\n{importtime(argv, env)}")


if __name__ == "__main__":
    main()

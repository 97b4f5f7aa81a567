"""Start-up time: `tallow --help`, `tallow list` and completing a model name.

Each is run as a fresh process, as a shell runs it (median of --reps, interleaved so drift
hits every case alike), from a fresh virtual environment holding a plain (not editable)
install of this checkout with the newest dependency versions its pins allow, made for the
run (or given with --venv). Budgets: `tallow --help` 0.15 s, `tallow list` 0.25 s, a
completion 0.25 s. The import-time breakdown of a case over budget (`python -X importtime`)
is printed, heaviest first, and the exit status is 1.

    python tests/benchmarks/startup.py [--reps 10] [--venv DIR]
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

ROOT = Path(__file__).resolve().parents[2]
BUDGET_S = {"tallow --help": 0.15, "tallow list": 0.25, "complete 'tallow run sm'": 0.25}


def timed(args: list[str], env: dict[str, str]) -> float:
    started = time.perf_counter()
    subprocess.run(args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    return time.perf_counter() - started


def importtime(python: str, args: list[str], env: dict[str, str], top: int = 12) -> str:
    r = subprocess.run([python, "-X", "importtime", *args], env=env, capture_output=True, text=True)
    rows = []
    for line in r.stderr.splitlines():
        if line.startswith("import time:") and "|" in line and "cumulative" not in line:
            _, cumulative, name = line.split("|")
            rows.append((int(cumulative), name.rstrip()))
    rows.sort(reverse=True)
    return "\n".join(f"  {us / 1000:7.1f} ms  {name}" for us, name in rows[:top])


def fresh_venv(where: Path) -> Path:
    """A new virtual environment with this checkout installed as a user installs it."""
    subprocess.run([sys.executable, "-m", "venv", str(where)], check=True)
    python = where / "bin" / "python"
    subprocess.run([str(python), "-m", "pip", "install", "-q", "--upgrade", "pip"], check=True)
    subprocess.run([str(python), "-m", "pip", "install", "-q", "--upgrade", "--upgrade-strategy", "eager", str(ROOT)],
                   check=True)
    return python


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--venv", type=Path, help="use this virtual environment (made when it does not exist)")
    args = ap.parse_args()
    venv = args.venv or Path(tempfile.mkdtemp(prefix="tallow-startup-venv-")) / "venv"
    python = str(venv / "bin" / "python") if (venv / "bin" / "python").exists() else str(fresh_venv(venv))
    versions = subprocess.run([python, "-m", "pip", "list", "--format=freeze"], capture_output=True, text=True).stdout
    print("in", venv, "with", ", ".join(v for v in versions.split() if v.startswith(("typer", "rich", "click"))))
    home = Path(tempfile.mkdtemp(prefix="tallow-startup-"))
    base = {k: v for k, v in os.environ.items() if not k.startswith(("TALLOW_", "_TALLOW", "COMP_"))}
    base["TALLOW_HOME"] = str(home)
    complete_env = {**base, "_TALLOW_COMPLETE": "complete_bash", "COMP_WORDS": "tallow run sm", "COMP_CWORD": "2"}
    cases = {
        "tallow --help": (["-m", "tallow.cli", "--help"], base),
        "tallow list": (["-m", "tallow.cli", "list"], base),
        "complete 'tallow run sm'": (["-m", "tallow.cli"], complete_env),
        "python -c pass (floor)": (["-c", "pass"], base),
    }
    for argv, env in cases.values():  # warm the page cache
        timed([python, *argv], env)
    results: dict[str, list[float]] = {}
    for _ in range(args.reps):
        for label, (argv, env) in cases.items():
            results.setdefault(label, []).append(timed([python, *argv], env))
    print(f"median of {args.reps} fresh processes (min-max):")
    over = []
    for label, samples in results.items():
        med, budget = statistics.median(samples), BUDGET_S.get(label)
        mark = "" if budget is None else ("  ok" if med <= budget else f"  OVER {budget} s")
        print(f"  {label:<28} {med * 1000:7.1f} ms ({min(samples) * 1000:.0f}-{max(samples) * 1000:.0f}){mark}")
        if budget is not None and med > budget:
            over.append(label)
    for label in over:
        argv, env = cases[label]
        print(f"\nimport time of {label}, heaviest first (cumulative):\n{importtime(python, argv, env)}")
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())

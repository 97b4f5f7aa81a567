"""Extra buffers (repacked weights) on and off, side by side, on whatever CPU runs it.

For the default model (Q4_1) and a Q4_0 and a Q8_0 quantization of it (made once with
`tallow quantize --pure --allow-requantize`), `tallow bench -p 512 -n 128` in fresh
processes with TALLOW_CPU_REPACK=on and =off, alternating, then llama.cpp's own
llama-bench with `--repack 0` and the same threads and flash attention. A row whose "on"
the machine's probe found crashing is reported as crashed, not run.

Target: the "off" path >= 0.97x llama-bench --repack 0 (prefill and decode), so the
fallback costs only what the kernels cost, in paired, alternating rounds
(tests/benchmarks/paired.py: subject tallow off, reference llama-bench); the "on" figures are
reported beside them. Exits 1 when missed, 3 when the machine was too noisy to say.

    python tests/benchmarks/repack.py [--reps 5] [--llama-bench PATH]
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

TYPES = ("Q4_0", "Q8_0")


def ensure_models(env) -> list[str]:
    from benchmarks.llamabench import tallow

    names = ["smollm2:135m"]
    listed = json.loads(subprocess.run([sys.executable, "-m", "tallow.cli", "list", "--json"], env=env,
                                       capture_output=True, check=True).stdout)
    have = {m["name"] for m in listed}
    for t in TYPES:
        name = f"bench-smollm2:{t.lower()}"
        if name not in have:
            p = tallow(["quantize", "smollm2:135m", "--type", t, "--pure", "--allow-requantize", "--name", name], env)
            _, err = p.communicate(timeout=900)
            if p.returncode != 0:
                sys.exit(f"quantize {t} failed: {err.decode()[-300:]}")
        names.append(name)
    return names


def tallow_bench(env, name: str, threads: int, flash: str) -> tuple[float, float]:
    from benchmarks.llamabench import tallow

    p = tallow(["bench", name, "-p", "512", "-n", "128", "-r", "4", "-t", str(threads), "-fa", flash, "--json"], env)
    out, err = p.communicate(timeout=900)
    if p.returncode != 0:
        raise RuntimeError(err.decode()[-300:])
    rows = json.loads(out)
    pp = next(r["avg_ts"] for r in rows if r["n_prompt"] and not r["n_gen"])
    tg = next(r["avg_ts"] for r in rows if r["n_gen"] and not r["n_prompt"])
    return pp, tg


def _against_llama_bench(name: str, path: Path, env: dict, binary, threads: int, flash: str, crashed: bool,
                         rounds: int) -> list:
    """One model's "off" path against llama-bench --repack 0 (its "on" figures reported beside)."""
    from benchmarks.llamabench import run_llama_bench
    from benchmarks.paired import Comparison, compare_two

    on: list[tuple[float, float]] = []

    def measure(arm: str) -> tuple[float, float]:
        if arm == "reference":
            rows = run_llama_bench(binary, path, "-p", "512", "-n", "128", "-r", "4", "-t", str(threads), "-fa", "1",
                                   "--repack", "0")
            return rows[0]["avg_ts"], rows[1]["avg_ts"]
        if not crashed:
            on.append(tallow_bench({**env, "TALLOW_CPU_REPACK": "on"}, name, threads, flash))
        return tallow_bench({**env, "TALLOW_CPU_REPACK": "off"}, name, threads, flash)

    verdicts = compare_two(Comparison(f"{name} pp512, off / llama-bench --repack 0", measure, 0.97, False, rounds,
                                      unit=" tok/s"),
                           Comparison(f"{name} tg128, off / llama-bench --repack 0", lambda arm: 0.0, 0.97, False))
    print(f"{name} with repacked weights: " + (f"pp512 {statistics.median(x[0] for x in on):.1f}, tg128 "
                                                f"{statistics.median(x[1] for x in on):.1f} tok/s" if on else "crashed"))
    return verdicts


def main() -> int:
    from benchmarks.llamabench import setup
    from benchmarks.paired import exit_code
    from tallow.models.resolve import locate
    from tallow.models.store import Store
    from tallow.runtime.host.threads import physical_cores

    args, home, env, binary = setup(reps=5)
    threads = physical_cores()
    names = ensure_models(env)
    doctor = json.loads(subprocess.run([sys.executable, "-m", "tallow.cli", "doctor", "--json", "--no-live"], env=env,
                                       capture_output=True, check=True).stdout)
    verdict = doctor["repack"]
    crashed = not verdict["on"] and verdict["probed"]
    flash = "on"  # the same kernels on both sides; the flash-attention choice is defaults.py's business
    print(f"{doctor['cpu']['model']}, {threads} threads, flash attention {flash}; extra buffer types: "
          f"{', '.join(verdict['extra_buffer_types']) or 'none'}; verdict: {verdict['reason']}")
    verdicts = []
    for name in names:
        verdicts += _against_llama_bench(name, locate(name, Store(home / "models")).path, env, binary, threads, flash,
                                         crashed, args.reps)
    return exit_code(verdicts)


if __name__ == "__main__":
    sys.exit(main())

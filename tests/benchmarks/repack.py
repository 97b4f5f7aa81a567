"""Extra buffers (repacked weights) on and off, side by side, on whatever CPU runs it.

For the default model (Q4_1) and a Q4_0 and a Q8_0 quantization of it (made once with
`tallow quantize --pure --allow-requantize`), `tallow bench -p 512 -n 128` in fresh
processes with TALLOW_CPU_REPACK=on and =off, alternating, then llama.cpp's own
llama-bench with `--repack 0` and the same threads and flash attention. A row whose "on"
the machine's probe found crashing is reported as crashed, not run.

Target: the "off" path within 3% of llama-bench --repack 0 (prefill and decode), so the
fallback costs only what the kernels cost. Figures are medians of --reps runs; the ratio
is the median of each run's ratio to the llama-bench run beside it. Exits 1 when missed.

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


def main() -> int:
    from benchmarks.llamabench import run_llama_bench, setup
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
    best = statistics.median
    print(f"{doctor['cpu']['model']}, {threads} threads, flash attention {flash}; extra buffer types: "
          f"{', '.join(verdict['extra_buffer_types']) or 'none'}; verdict: {verdict['reason']}")
    print(f"{'model':<22} {'pp512 on':>9} {'pp512 off':>9} {'lb off':>8} {'tg128 on':>9} {'tg128 off':>9} {'lb off':>8}"
          f" {'off/lb pp':>9} {'off/lb tg':>9}")
    ok = True
    for name in names:
        on, off, lb = [], [], []
        path = locate(name, Store(home / "models")).path
        for _ in range(args.reps):
            if not crashed:
                on.append(tallow_bench({**env, "TALLOW_CPU_REPACK": "on"}, name, threads, flash))
            off.append(tallow_bench({**env, "TALLOW_CPU_REPACK": "off"}, name, threads, flash))
            rows = run_llama_bench(binary, path, "-p", "512", "-n", "128", "-r", "4", "-t", str(threads), "-fa", "1",
                                   "--repack", "0")
            lb.append((rows[0]["avg_ts"], rows[1]["avg_ts"]))
        pp_on = f"{best(x[0] for x in on):9.1f}" if on else f"{'crashed':>9}"
        tg_on = f"{best(x[1] for x in on):9.1f}" if on else f"{'crashed':>9}"
        pp_off, tg_off = best(x[0] for x in off), best(x[1] for x in off)
        pp_lb, tg_lb = best(x[0] for x in lb), best(x[1] for x in lb)
        # each repetition's tallow run against the llama-bench run right after it: slow
        # drifts of a shared machine cancel, and the median drops the odd noisy pair
        r_pp = statistics.median(o[0] / b[0] for o, b in zip(off, lb))
        r_tg = statistics.median(o[1] / b[1] for o, b in zip(off, lb))
        ok &= r_pp >= 0.97 and r_tg >= 0.97
        print(f"{name:<22} {pp_on} {pp_off:9.1f} {pp_lb:8.1f} {tg_on} {tg_off:9.1f} {tg_lb:8.1f} {r_pp:9.3f} {r_tg:9.3f}")
    print("target (off within 3% of llama-bench --repack 0): " + ("met" if ok else "MISSED"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

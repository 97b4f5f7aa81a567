"""tallow's defaults against llama-bench's defaults: pp512 and tg128 at depth 0 and 2,048.

`tallow bench smollm2:135m -p 512 -n 0 -d D -r 1` against `llama-bench -p 512 -n 0 -d D
-r 1` (and the same with `-p 0 -n 128`), every other setting at each tool's default: tallow's
flash attention, threads and weight layout are its calibrated choices, llama-bench's its
own (`--repack 0` only where tallow's calibration found the repacked kernels crash, as
llama-bench then does). Each figure is a fresh process of each tool in paired, alternating
rounds (tests/benchmarks/paired.py), tokens/s.

Then `tallow run`'s own rates, as a user sees them: a prompt of P tokens (about 512: a
piped list of numbers and "Count on."), 128 tokens answered greedily, `--json`'s
prefill_tps and decode_tps, against llama-bench's pp at P tokens and tg128 at depth P, from
the same rounds.

Targets: every ratio >= 1.0x (issue 53: never slower than llama.cpp). Exits 1 when one is
missed, 3 when the machine was too noisy to say.

    python tests/benchmarks/defaults.py [--rounds 7] [--depths 0,2048] [--no-run] [--llama-bench PATH]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.paired import Comparison, compare, compare_two, exit_code  # noqa: E402

TESTS = {"pp512": ("512", "0"), "tg128": ("0", "128")}


def main() -> int:
    from helpers.processes import shared_home

    from benchmarks.llamabench import llama_bench, repack_args, run_llama_bench, tallow, tallow_env
    from tallow.models.resolve import locate
    from tallow.models.store import Store

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--depths", default="0,2048")
    ap.add_argument("--llama-bench", default=None)
    ap.add_argument("--no-run", action="store_true", help="only tallow bench, not tallow run's own rates")
    args = ap.parse_args()
    home = shared_home()
    env = tallow_env(home, TALLOW_MACHINE_CACHE=str(home / "machine.json"))
    binary = llama_bench(args.llama_bench)
    path = locate("smollm2:135m", Store(home / "models")).path
    chosen: set[str] = set()

    def measure(arm: str, p: str, n: str, depth: str) -> float:
        shape = ["-p", p, "-n", n, "-d", depth, "-r", "1"]
        if arm == "reference":
            return run_llama_bench(binary, path, *shape, *repack_args(home))[0]["avg_ts"]
        proc = tallow(["bench", "smollm2:135m", *shape, "--json"], env)
        out, err = proc.communicate(timeout=900)
        if proc.returncode != 0:
            sys.exit(err.decode()[-400:])
        row = json.loads(out)[0]
        chosen.add(f"flash attention {row['flash_attn']}")
        return row["avg_ts"]

    verdicts = []
    for depth in [d for d in args.depths.split(",") if d]:
        for name, (p, n) in TESTS.items():
            verdicts.append(compare(Comparison(
                f"{name} at depth {depth}", lambda arm, p=p, n=n, d=depth: measure(arm, p, n, d),
                target=1.0, lower_is_better=False, rounds=args.rounds, unit=" tok/s")))
    if not args.no_run:
        verdicts += run_rates(binary, path, env, home, args.rounds)
    print(f"tallow chose: {', '.join(sorted(chosen))}")
    for v in verdicts:
        print(v.line())
    return exit_code(verdicts)


DOCUMENT = " ".join(str(n) for n in range(1, 250)) + "\n"


def run_rates(binary, path: Path, env: dict, home: Path, rounds: int) -> list:
    """`tallow run`'s prefill and decode rates against llama-bench's at the same shape."""
    from benchmarks.llamabench import repack_args, run_llama_bench

    def ours() -> tuple[float, float, int]:
        done = subprocess.run([sys.executable, "-m", "tallow.cli", "run", "smollm2:135m", "Count on.", "-n", "128",
                               "--temperature", "0", "--json", "--no-cache"], input=DOCUMENT.encode(), env=env,
                              capture_output=True, timeout=900)
        if done.returncode != 0:
            sys.exit(done.stderr.decode()[-400:])
        out = json.loads(done.stdout)
        return out["timings"]["prefill_tps"], out["timings"]["decode_tps"], out["usage"]["prompt_tokens"]

    n_prompt = ours()[2]

    def measure(arm: str) -> tuple[float, float]:
        if arm == "subject":
            return ours()[:2]
        pp = run_llama_bench(binary, path, "-p", str(n_prompt), "-n", "0", "-r", "1", *repack_args(home))
        tg = run_llama_bench(binary, path, "-p", "0", "-n", "128", "-d", str(n_prompt), "-r", "1", *repack_args(home))
        return pp[0]["avg_ts"], tg[0]["avg_ts"]

    return compare_two(
        Comparison(f"run: prefill of {n_prompt} tokens", measure, target=1.0, lower_is_better=False, rounds=rounds,
                   unit=" tok/s"),
        Comparison(f"run: decode of 128 at depth {n_prompt}", lambda arm: 0.0, target=1.0, lower_is_better=False))


if __name__ == "__main__":
    sys.exit(main())

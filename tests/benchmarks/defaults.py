"""tallow's defaults against llama.cpp's defaults, same model and machine.

A chat turn deep in a conversation: `tallow bench -p 128 -n 128 -d 2048` with every
setting at its default (flash attention "auto" is tallow's calibrated choice for a
context that fills, as a chat's does), against `llama-bench -p 128 -n 128 -d 2048` with
its defaults (flash attention auto, which llama.cpp turns on for the CPU; `--repack 0`
only where tallow's calibration found the repacked kernels crash, as llama-bench then
does). Alternating, fresh processes, median of --reps.

Targets: decode at depth 2,048 >= 1.5x llama-bench's; prefill >= 0.95x. Exits 1 when one
is missed.

    python tests/benchmarks/defaults.py [--reps 3] [--llama-bench PATH]
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> int:
    from benchmarks.llamabench import repack_args, run_llama_bench, setup, tallow
    from tallow.models.resolve import locate
    from tallow.models.store import Store

    args, home, env, binary = setup()
    path = locate("smollm2:135m", Store(home / "models")).path
    ours, theirs, chosen = [], [], set()
    for _ in range(args.reps):
        p = tallow(["bench", "smollm2:135m", "-p", "128", "-n", "128", "-d", "2048", "-r", "2", "--json"], env)
        out, err = p.communicate(timeout=900)
        if p.returncode != 0:
            sys.exit(err.decode()[-400:])
        rows = json.loads(out)
        chosen.update(r["flash_attn"] for r in rows)
        ours.append((rows[0]["avg_ts"], rows[1]["avg_ts"]))
        lb = run_llama_bench(binary, path, "-p", "128", "-n", "128", "-d", "2048", "-r", "2", *repack_args(home))
        theirs.append((lb[0]["avg_ts"], lb[1]["avg_ts"]))
    med = statistics.median
    pp, tg = med(x[0] for x in ours), med(x[1] for x in ours)
    lpp, ltg = med(x[0] for x in theirs), med(x[1] for x in theirs)
    print(f"default model at depth 2048, median of {args.reps}; tallow chose flash attention {', '.join(sorted(chosen))}")
    print(f"prefill pp128: tallow {pp:.1f} tok/s, llama-bench {lpp:.1f}: {pp / lpp:.2f}x (target >= 0.95)")
    print(f"decode  tg128: tallow {tg:.1f} tok/s, llama-bench {ltg:.1f}: {tg / ltg:.2f}x (target >= 1.50)")
    ok = tg / ltg >= 1.5 and pp / lpp >= 0.95
    print("targets met" if ok else "TARGET MISSED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

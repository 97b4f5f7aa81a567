"""The prompt cache across processes: a 2,000-token prompt run twice, in two processes.

The first run prefills everything and saves the prompt's KV state after answering; the
second loads it and prefills one token. TTFT is tallow's own per-request figure (model
load excluded). Paired, alternating rounds (tests/benchmarks/paired.py), each arm in a home
of its own: the reference a first run (an empty cache), the subject a second run (after an
untimed first one). Target: the second run's TTFT <= 0.05x the first's (20x lower). Whether
every answer (greedy) was the same is reported: a last prompt token read alone rather than in
a batch of 2,000 rounds differently, and a near-tie can go the other way. Exits 1 when
missed, 3 when the machine was too noisy to say.

    python tests/benchmarks/prompt_cache.py [--rounds 5]
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> int:
    import argparse

    from benchmarks.overhead import default_model
    from benchmarks.paired import Comparison, compare, exit_code

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    model = default_model()
    text = " ".join(f"Entry {i}: the shipment to warehouse {i % 17} left on day {i % 29} with {i * 3 % 41} crates."
                    for i in range(82))
    cmd = [sys.executable, "-m", "tallow.cli", "run", str(model), "Which warehouse got the most crates?",
           "--temperature", "0", "-n", "48", "--json"]
    answers, sizes, sources = set(), [], []

    def run(home: str) -> dict:
        env = {k: v for k, v in os.environ.items() if not k.startswith("TALLOW_")}
        env.update(TALLOW_HOME=home, TALLOW_NO_LOG="1")
        out = json.loads(subprocess.run(cmd, input=text.encode(), capture_output=True, env=env, check=True).stdout)
        answers.add(out["text"])
        return out

    def measure(arm: str) -> float:
        with tempfile.TemporaryDirectory() as home:
            if arm == "subject":
                run(home)  # untimed: it saves the prompt's state
                sizes.append(sum(p.stat().st_size for p in Path(home, "cache").rglob("*.state")))
            out = run(home)
            sources.append((arm, out["usage"]["cached_tokens"], out["usage"].get("cache_source")))
            return out["timings"]["ttft_ms"]

    verdict = compare(Comparison("TTFT, second run / first run", measure, 0.05, True, args.rounds, unit=" ms"))
    warm = [(c, s) for arm, c, s in sources if arm == "subject"]
    print(f"second runs: cached {min(c for c, _ in warm)}-{max(c for c, _ in warm)} tokens from "
          f"{', '.join(sorted({str(s) for _, s in warm}))}; saved state on disk: {max(sizes) / 1e6:.1f} MB; "
          f"answers identical: {len(answers) == 1}")
    return exit_code([verdict])


if __name__ == "__main__":
    sys.exit(main())

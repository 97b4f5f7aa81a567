"""The prompt cache across processes: a 2,000-token prompt run twice, in two processes.

The first run prefills everything and saves the prompt's KV state after answering; the
second loads it and prefills one token. TTFT is tallow's own per-request figure (model
load excluded). Target: second TTFT at least 20x lower, same answer at temperature 0.

    python tests/benchmarks/prompt_cache.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> None:
    from benchmarks.overhead import default_model

    model = default_model()
    text = " ".join(f"Entry {i}: the shipment to warehouse {i % 17} left on day {i % 29} with {i * 3 % 41} crates."
                    for i in range(82))
    with tempfile.TemporaryDirectory() as home:
        env = {k: v for k, v in os.environ.items() if not k.startswith("TALLOW_")}
        env.update(TALLOW_HOME=home, TALLOW_NO_LOG="1")
        cmd = [sys.executable, "-m", "tallow.cli", "run", str(model), "Which warehouse got the most crates?",
               "--temperature", "0", "-n", "48", "--json"]
        runs = []
        for _ in range(2):
            r = subprocess.run(cmd, input=text.encode(), capture_output=True, env=env, check=True)
            runs.append(json.loads(r.stdout))
        size = sum(p.stat().st_size for p in Path(home, "cache").rglob("*.state"))
    first, second = runs
    for label, run in (("first", first), ("second", second)):
        u, t = run["usage"], run["timings"]
        print(f"{label:>6}: prompt {u['prompt_tokens']} tok, cached {u['cached_tokens']} ({u['cache_source']}), "
              f"TTFT {t['ttft_ms']:.1f} ms, load {t['load_ms']:.0f} ms")
    ratio = first["timings"]["ttft_ms"] / second["timings"]["ttft_ms"]
    same = first["text"] == second["text"]
    print(f"saved state on disk: {size / 1e6:.1f} MB")
    print(f"TTFT first/second: {ratio:.1f}x (target >= 20x: {'met' if ratio >= 20 else 'NOT met'}); "
          f"answers identical: {same}")


if __name__ == "__main__":
    main()

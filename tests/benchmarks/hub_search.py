"""Search with fit verdicts against the time of one hub round trip per result.

The hub emulator (tests/helpers/hub_server.py) answers every request after `--delay`
seconds, as a far hub would, and holds `--results` repositories of real GGUF files (the
synthetic model at three precisions). Each round times, side by side:
- reference: `--results` round trips, one after another (a HEAD of a file, the cheapest
  request the hub answers), i.e. one round trip per result;
- subject: `tallow find`'s work through the Python layer: the search, then each result's
  file listing and one header read, judged by the memory planner.
Target: subject / reference <= 1.0 (the issue's "under the time of one HTTP round trip per
result"). Paired, alternating rounds (benchmarks/paired.py); exit 1 when missed.

    python tests/benchmarks/hub_search.py [--results 20] [--delay 0.05] [--rounds 7]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from helpers.hub_server import FakeHub  # noqa: E402
from helpers.synth import write_synthetic_gguf  # noqa: E402

from benchmarks.paired import Comparison, compare, exit_code  # noqa: E402


def quantized(folder: Path) -> dict[str, Path]:
    from tallow.runtime import backend

    out = {"F32": write_synthetic_gguf(folder / "synth-F32.gguf")}
    for name, ftype in (("F16", 1), ("Q8_0", 7)):
        out[name] = folder / f"synth-{name}.gguf"
        if backend.quantize(out["F32"], out[name], ftype) != 0:
            raise SystemExit(f"could not write the {name} file")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", type=int, default=20)
    ap.add_argument("--delay", type=float, default=0.05, help="seconds the emulated hub waits before each answer")
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()
    from huggingface_hub import get_session

    from tallow.models.finding.fit import Budget
    from tallow.models.finding.search import search
    from tallow.models.hub import Hub

    hub = FakeHub()
    with tempfile.TemporaryDirectory() as tmp:
        files = quantized(Path(tmp))
        for i in range(args.results):
            for name, path in files.items():
                hub.add(f"bench/Model-{i:02d}-GGUF", f"model-{name}.gguf", path)
            hub.describe(f"bench/Model-{i:02d}-GGUF", downloads=1000 - i)
        hub.delay = args.delay
        client = Hub(endpoint=hub.url)
        budget = Budget(10**12, None, 4096)
        url = f"{hub.url}/bench/Model-00-GGUF/resolve/main/model-Q8_0.gguf"

        def measure(arm: str) -> float:
            started = time.perf_counter()
            if arm == "reference":
                for _ in range(args.results):
                    get_session().head(url)
            else:
                results = search(client, "bench", limit=args.results, budget=budget)
                if len(results) != args.results or not all(r.best for r in results):
                    raise SystemExit(f"the search judged {sum(1 for r in results if r.best)} of {args.results} results")
            return time.perf_counter() - started

        verdict = compare(Comparison(f"find: {args.results} results with fit / {args.results} round trips",
                                     measure, target=1.0, lower_is_better=True, rounds=args.rounds, unit=" s"))
        hub.close()
    return exit_code([verdict])


if __name__ == "__main__":
    sys.exit(main())

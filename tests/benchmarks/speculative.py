"""Prompt-lookup speculative decoding on an input-grounded task, against plain decoding.

"Repeat this text with the typos fixed" on a ~1,000-token text, greedy, the same request
decoded plainly and with `--draft lookup` in paired, alternating rounds
(tests/benchmarks/paired.py). The target is the default model (Q4_1: a compute-bound decode
on a CPU), or with --f32 the same dequantized to F32 (memory-bound, as the 1-8B models people
run are: where speculation pays). Prints decode tok/s for both, the ratio's median and
middle half (target >= 1.3x), the acceptance rate, and whether the answers are identical
(they can part at a near-tie: batched and single-row kernels round differently). Exits 1
when the target is missed, 3 when the machine was too noisy to say.

    python tests/benchmarks/speculative.py [--rounds 5] [--tokens 400] [--f32]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def typo_text(words: int = 700) -> str:
    rng = random.Random(3)
    base = ("The history of the lighthouse is a story of coastal communities, maritime trade and engineering. "
            "Early lighthouses were simple fires on hilltops; later, towers of stone carried lamps fuelled by oil. "
            "Keepers lived beside them, trimming wicks and polishing lenses through long winter nights. "
            "Steam ships, radio beacons and satellites changed the work, but many towers still stand. ").split()
    out = [base[i % len(base)] for i in range(words)]
    for i in range(0, len(out), 7):
        w = out[i]
        if len(w) > 3:
            j = rng.randrange(1, len(w) - 2)
            out[i] = w[:j] + w[j + 1] + w[j] + w[j + 2:]
    return " ".join(out)


def main() -> int:
    import tempfile

    from benchmarks.overhead import default_model
    from benchmarks.paired import Comparison, compare, exit_code
    from benchmarks.recall import f32_model
    from tallow.runtime.engine import Engine
    from tallow.runtime.types import FinalEvent, LoadSettings, Sampling, TokenEvent

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--tokens", type=int, default=400)
    ap.add_argument("--f32", action="store_true", help="a memory-bound target: the default model at F32")
    args = ap.parse_args()
    answers: dict[str, list[int]] = {}
    acceptance: list[float] = []
    with tempfile.TemporaryDirectory() as scratch:
        model = f32_model(default_model(), Path(scratch)) if args.f32 else default_model()
        with Engine(model, LoadSettings(n_ctx=4096, n_threads=2)) as engine:
            messages = [{"role": "user", "content": f"{typo_text()}\n\nRepeat the text above exactly, with the typos fixed."}]

            def rate(arm: str) -> float:
                draft = "lookup" if arm == "subject" else None
                req = engine.request(messages, max_tokens=args.tokens, sampling=Sampling(temperature=0),
                                     ignore_eos=True, draft=draft)
                events = list(engine.stream(req))
                final = events[-1]
                assert isinstance(final, FinalEvent)
                answers[arm] = [e.token for e in events if isinstance(e, TokenEvent)]
                if draft:
                    acceptance.append(final.usage.acceptance or 0.0)
                return final.timings.decode_tps

            print(f"target {'the default model at F32' if args.f32 else 'the default model'}, "
                  f"{args.tokens} output tokens, greedy")
            verdict = compare(Comparison("lookup / plain decode", rate, target=1.3, lower_is_better=False,
                                         rounds=args.rounds, max_rounds=2 * args.rounds, unit=" tok/s"))
    print(f"acceptance {statistics.median(acceptance):.0%}")
    a, b = answers["reference"], answers["subject"]
    first = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
    print("answers identical" if a == b else f"answers part at token {first} of {len(a)}")
    return exit_code([verdict])


if __name__ == "__main__":
    sys.exit(main())

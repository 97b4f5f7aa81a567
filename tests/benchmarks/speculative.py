"""Prompt-lookup speculative decoding on an input-grounded task, against plain decoding.

"Repeat this text with the typos fixed" on a ~1,000-token text, default model, greedy,
the same request decoded plainly and with `--draft lookup`, interleaved. Prints decode
tok/s for both, the ratio (target >= 1.3x), the acceptance rate, and whether the two
answers are identical (they can part at a near-tie: llama.cpp's batched kernels round
differently from its single-token ones).

    python tests/benchmarks/speculative.py [--reps 3] [--tokens 400]
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


def main() -> None:
    from benchmarks.overhead import default_model
    from tallow.runtime.engine import Engine
    from tallow.runtime.types import FinalEvent, LoadSettings, Sampling, TokenEvent

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=400)
    args = ap.parse_args()
    with Engine(default_model(), LoadSettings(n_ctx=4096, n_threads=2)) as engine:
        text = typo_text()
        messages = [{"role": "user", "content": f"{text}\n\nRepeat the text above exactly, with the typos fixed."}]
        results = {None: [], "lookup": []}
        answers, acceptance = {}, []
        for rep in range(args.reps):
            for draft in ((None, "lookup") if rep % 2 == 0 else ("lookup", None)):
                req = engine.request(messages, max_tokens=args.tokens, sampling=Sampling(temperature=0),
                                     ignore_eos=True, draft=draft)
                events = list(engine.stream(req))
                final = events[-1]
                assert isinstance(final, FinalEvent)
                results[draft].append(final.timings.decode_tps)
                answers[draft] = [e.token for e in events if isinstance(e, TokenEvent)]
                if draft:
                    acceptance.append(final.usage.acceptance or 0.0)
                print(f"  rep {rep + 1} {draft or 'plain':>6}: {final.timings.decode_tps:6.1f} tok/s"
                      + (f", {final.usage.accepted_tokens}/{final.usage.draft_tokens} drafts accepted" if draft else ""))
        print(f"prompt {len(req.prompt_tokens)} tokens, {args.tokens} output tokens, greedy")
        plain, fast = statistics.median(results[None]), statistics.median(results["lookup"])
        print(f"decode: plain {plain:.1f} tok/s, lookup {fast:.1f} tok/s: {fast / plain:.2f}x "
              f"(target >= 1.3x: {'met' if fast / plain >= 1.3 else 'NOT met'}); "
              f"acceptance {statistics.median(acceptance):.0%}")
        a, b = answers[None], answers["lookup"]
        same = a == b
        first = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
        print("answers identical" if same else f"answers part at token {first} of {len(a)}")


if __name__ == "__main__":
    main()

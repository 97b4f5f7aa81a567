"""What KV reuse saves a chat: turn 10's time to first token with and without it.

A 10-turn conversation on the default model grows to about 1,500 tokens of history.
Turn 10 is measured three ways, side by side in one process:

  reuse    the history is in the KV cache (as in `tallow chat`): only the new message is read
  full     the cache is cleared first: the whole history is prefilled again (a tool without reuse)
  turn 1   the same new message with no history at all (attention over a long history still
           costs something with reuse; this says how much)

Target: reuse <= 0.1x full.      python tests/benchmarks/chat_reuse.py [--reps 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

TOPICS = ["rivers", "mountains", "deserts", "forests", "glaciers", "islands", "volcanoes", "caves", "reefs", "prairies"]


def message(i: int) -> str:
    topic = TOPICS[i % len(TOPICS)]
    return (f"Question {i + 1}. Tell me three short facts about {topic}. Keep each fact to one sentence, "
            f"mention one place where {topic} can be found, and say why {topic} matter to the people "
            f"and animals living near them. Please avoid lists longer than three items and do not repeat "
            f"anything you said about earlier topics in this conversation.")


def ttft(engine, request) -> tuple[float, int]:
    from tallow.runtime.types import FinalEvent

    final = [e for e in engine.stream(request) if isinstance(e, FinalEvent)][0]
    return final.timings.ttft_ms, final.usage.cached_tokens


def main() -> None:
    from benchmarks.overhead import default_model
    from tallow.runtime.chat import ChatSettings, Conversation
    from tallow.runtime.engine import Engine
    from tallow.runtime.types import LoadSettings, Sampling

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--answer-tokens", type=int, default=96)
    args = ap.parse_args()
    greedy = Sampling(temperature=0)
    with Engine(default_model(), LoadSettings(n_ctx=4096, n_threads=2)) as engine:
        conv = Conversation(engine, ChatSettings(greedy, max_tokens=args.answer_tokens))
        for i in range(9):
            list(conv.ask(message(i)))
        last = message(9)
        history_prompt = engine.request(conv._all([]), max_tokens=1, sampling=greedy)
        turn10 = engine.request(conv._all([{"role": "user", "content": last}]), max_tokens=1, sampling=greedy)
        alone = engine.request([{"role": "user", "content": last}], max_tokens=1, sampling=greedy)
        print(f"history before turn 10: {len(history_prompt.prompt_tokens)} tokens; "
              f"turn 10 prompt: {len(turn10.prompt_tokens)} tokens; the new message alone: {len(alone.prompt_tokens)}")
        results: dict[str, list[float]] = {"reuse": [], "full": [], "turn1": []}
        for rep in range(args.reps):
            engine.reset()
            list(engine.stream(history_prompt))  # the cache holds the history, as after turn 9
            t, cached = ttft(engine, turn10)
            results["reuse"].append(t)
            engine.reset()
            t_full, cached_full = ttft(engine, turn10)
            results["full"].append(t_full)
            engine.reset()
            results["turn1"].append(ttft(engine, alone)[0])
            print(f"  rep {rep + 1}: reuse {t:7.1f} ms ({cached} cached)   full {t_full:7.1f} ms ({cached_full} cached)"
                  f"   turn 1 {results['turn1'][-1]:6.1f} ms")
        med = {k: statistics.median(v) for k, v in results.items()}
        ratio = med["reuse"] / med["full"]
        print(f"\nmedian TTFT of turn 10: reuse {med['reuse']:.1f} ms, full prefill {med['full']:.1f} ms: "
              f"ratio {ratio:.3f} (target <= 0.1: {'met' if ratio <= 0.1 else 'NOT met'})")
        print(f"turn 1 with the same new message: {med['turn1']:.1f} ms; turn 10 with reuse costs "
              f"{med['reuse'] / med['turn1']:.2f}x that (attention over {len(history_prompt.prompt_tokens)} tokens of history)")


if __name__ == "__main__":
    main()

"""What KV reuse saves a chat: turn 10's time to first token with and without it.

A 10-turn conversation on the default model grows to about 1,500 tokens of history.
Turn 10 is measured in paired, alternating rounds in one process (tests/benchmarks/paired.py):

  reuse    (subject) the history is in the KV cache (as in `tallow chat`): only the new message is read
  full     (reference) the cache is cleared first: the whole history is prefilled again (a tool
           without reuse)

and, reported beside them, turn 1: the same new message with no history at all (attention
over a long history still costs something with reuse; this says how much).

Target: reuse <= 0.1x full. Exits 1 when missed, 3 when the machine was too noisy to say.

    python tests/benchmarks/chat_reuse.py [--rounds 5]
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


def main() -> int:
    from benchmarks.overhead import default_model
    from benchmarks.paired import Comparison, compare, exit_code
    from tallow.runtime.chat import ChatSettings, Conversation
    from tallow.runtime.engine import Engine
    from tallow.runtime.types import LoadSettings, Sampling

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--answer-tokens", type=int, default=96)
    args = ap.parse_args()
    greedy = Sampling(temperature=0)
    with Engine(default_model(), LoadSettings(n_ctx=4096, n_threads=2)) as engine:
        conv = Conversation(engine, ChatSettings(greedy, max_tokens=args.answer_tokens))
        for i in range(9):
            list(conv.ask(message(i)))
        last = message(9)
        history = engine.request(conv.messages, max_tokens=1, sampling=greedy)
        turn10 = engine.request([*conv.messages, {"role": "user", "content": last}], max_tokens=1, sampling=greedy)
        alone = engine.request([{"role": "user", "content": last}], max_tokens=1, sampling=greedy)
        print(f"history before turn 10: {len(history.prompt_tokens)} tokens; "
              f"turn 10 prompt: {len(turn10.prompt_tokens)} tokens; the new message alone: {len(alone.prompt_tokens)}")
        turn1: list[float] = []

        def measure(arm: str) -> float:
            engine.reset()
            if arm == "subject":
                list(engine.stream(history))  # the cache holds the history, as after turn 9
                t, cached = ttft(engine, turn10)
                assert cached >= len(history.prompt_tokens) - 8, cached  # all but the generation prompt
                return t
            t, _ = ttft(engine, turn10)
            engine.reset()
            turn1.append(ttft(engine, alone)[0])
            return t

        verdict = compare(Comparison("turn 10 TTFT, reuse / full prefill", measure, 0.1, True, args.rounds,
                                     unit=" ms"))
        print(f"turn 1 with the same new message: {statistics.median(turn1):.1f} ms; turn 10 with reuse costs "
              f"{statistics.median(verdict.figures['subject']) / statistics.median(turn1):.2f}x that "
              f"(attention over {len(history.prompt_tokens)} tokens of history)")
    return exit_code([verdict])


if __name__ == "__main__":
    sys.exit(main())

"""A recurrent model's chat with state checkpoints, against a full re-prefill of every turn.

A recurrent model's cache cannot be cut back, so without checkpoints (runtime/checkpoints.py)
every turn whose prompt parts from what the sequence holds (the answer as the template
writes it is not always the tokens sampled) is prefilled from the start. The model is a
synthetic Mamba written with `gguf` (random weights; no recurrent model small enough is on
the package index), 512 wide and 16 layers deep, about 26M parameters in F32. The chat:
10 turns, fixed user and assistant messages (so both arms read the same prompts), each
turn answered with 16 greedy tokens.

One figure, paired and alternating (tests/benchmarks/paired.py): the chat's summed time to
first token, checkpoints (subject) against `cache_prompt: false` on every turn (reference,
what a tool without checkpoints must do). Target <= 0.5x. It also prints the tokens each
turn took from a checkpoint, and exits 1 when the target is missed, 3 when inconclusive.

    python tests/benchmarks/recurrent.py [--rounds 5]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.paired import Comparison, compare, exit_code  # noqa: E402

TOPICS = ["rivers", "mountains", "deserts", "forests", "glaciers", "islands", "volcanoes", "caves", "reefs", "prairies"]


def conversation() -> list[list[dict]]:
    """Each turn's messages: the history so far and the new question."""
    messages = [{"role": "system", "content": "You are a patient geography teacher who answers in short paragraphs."}]
    turns = []
    for topic in TOPICS:
        messages.append({"role": "user", "content": f"Tell me three facts about {topic}, where {topic} can be "
                                                    f"found, and why {topic} matter to the people living near them."})
        turns.append(list(messages))
        messages.append({"role": "assistant", "content": f"{topic.capitalize()} shape the land around them. "
                                                         f"They are found on every continent, and people near "
                                                         f"{topic} depend on them for water, food and work."})
    return turns


def chat(engine, reuse: bool, counts: list[int] | None = None) -> float:
    """The whole chat's summed time to first token, in ms."""
    from tallow.runtime.types import FinalEvent, Sampling

    engine.reset()
    total = 0.0
    for messages in conversation():
        request = engine.request(messages, max_tokens=16, sampling=Sampling(temperature=0), reuse_cache=reuse)
        final = [e for e in engine.stream(request) if isinstance(e, FinalEvent)][0]
        total += final.timings.ttft_ms
        if counts is not None:
            counts.append(final.usage.cached_tokens)
    return total


def main() -> int:
    from helpers.synth import write_synthetic_mamba

    from tallow.runtime.engine import Engine
    from tallow.runtime.types import LoadSettings

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = write_synthetic_mamba(Path(tmp) / "mamba.gguf", n_layer=16, n_embd=512)
        with Engine(path, LoadSettings(n_ctx=4096, n_threads=2)) as engine:
            counts: list[int] = []
            chat(engine, True, counts)
            sizes = [len(engine.request(m).prompt_tokens) for m in conversation()]
            print("turn: prompt tokens (from a checkpoint): "
                  + ", ".join(f"{i + 1}: {n} ({c})" for i, (n, c) in enumerate(zip(sizes, counts))))
            verdict = compare(Comparison("10-turn chat, summed TTFT", lambda arm: chat(engine, arm == "subject"),
                                         target=0.5, rounds=args.rounds, unit=" ms"))
    return exit_code([verdict])


if __name__ == "__main__":
    sys.exit(main())

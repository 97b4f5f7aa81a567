"""Recall drafts (drafts from what earlier requests wrote) on traces written for them,
against plain decoding and against a prompt lookup alone, with a memory-bound target.

The target is the default model dequantized to F32 (540 MB: reading its weights bounds a
decode step, as it does for the 1-8B models people run; a 135M Q4 model on a CPU is
compute-bound, and no speculation pays there). Each trace is a series of fresh
conversations, greedy, 160 tokens each; the first `seed` of them only fill the memory, and
the decode rate of the rest is the figure:

- regenerate: an agent asks fresh contexts for the same function again;
- tool loop: fresh contexts each must call a shell tool (the constrained JSON of a required
  tool choice), for different tasks;
- edit loop: a file in the prompt, edited and written out whole, one edit per request;
- free text: stories on different subjects, sampled (temperature 0.8, seed 1) to their own
  end, where nothing is meant to be seen twice.

Each comparison is paired and alternating (tests/benchmarks/paired.py); targets: recall >=
1.5x plain on regenerate and tool loop, >= 1.0x a prompt lookup on every trace, >= 0.97x plain
on free text. It also checks that every arm of a greedy trace gave the same answers. Exits 1
when a target is missed, 3 when one is inconclusive.

    python tests/benchmarks/recall.py [--rounds 5] [--model PATH]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.paired import Comparison, compare, exit_code  # noqa: E402

TOKENS = 160
FUNCTION = ("Write a Python function load_config(path) that reads a JSON file, checks that the keys 'host', 'port' "
            "and 'debug' are present, and returns a dict. Include a docstring and comments.")
SHELL = {"type": "object", "properties": {"command": {"type": "string"}, "cwd": {"type": "string"},
                                          "timeout": {"type": "integer"}},
         "required": ["command", "cwd", "timeout"], "additionalProperties": False}
TASKS = ["Run the unit tests of the parser module.", "Run the unit tests of the scheduler module.",
         "Run the unit tests of the engine module.", "Run the unit tests of the cache module.",
         "Run the linter on the parser module."]
CODE = "\n".join(f"def step_{i}(values):\n    total = 0\n    for v in values:\n        total += v * {i}\n"
                 f"    return total\n" for i in range(6))
EDIT = "Here is a file:\n\n{code}\nRename the argument of step_{n} to items. Write out the whole file."
STORY = "Write a short story about a {who} who learns to {what}."


@dataclass(frozen=True)
class Trace:
    asks: list[str]
    seed: int  # requests that only fill the memory
    tools: bool = False  # a tool call is required (the constrained JSON of tool loops)
    free: bool = False  # sampled at temperature 0.8, seed 1, to its own end: nothing repeats on purpose


TRACES = {
    "regenerate": Trace([FUNCTION] * 4, 1),
    "tool loop": Trace(TASKS, 2, tools=True),
    "edit loop": Trace([EDIT.format(code=CODE, n=n) for n in range(4)], 1),
    "free text": Trace([STORY.format(who=w, what=s) for w, s in (("fox", "sail"), ("baker", "fly"), ("robot", "paint"),
                                                                ("whale", "sing"))], 2, free=True),
}


def f32_model(source: Path, home: Path) -> Path:
    """The source dequantized to F32 by tallow quantize, in a scratch store."""
    env = {**os.environ, "TALLOW_HOME": str(home)}
    subprocess.run(["tallow", "quantize", str(source), "--type", "F32", "--allow-requantize", "--name", "target:f32",
                    "--offline"], check=True, env=env, capture_output=True)
    return max((p for p in (home / "models" / "blobs").iterdir()), key=lambda p: p.stat().st_size)


class Traces:
    """One loaded target; `rate(trace, mode)` runs a trace in a mode: plain, lookup (the
    prompt and output only) or recall (and earlier requests), from an empty memory."""

    def __init__(self, engine) -> None:
        self.engine = engine
        self.answers: dict[tuple[str, str], list[list[int]]] = {}

    def rate(self, trace: str, mode: str) -> float:
        from tallow.runtime.drafting.recall import BUDGET, Recall
        from tallow.runtime.tools.choice import Tool, ToolChoice
        from tallow.runtime.types import FinalEvent, Sampling, TokenEvent

        engine, spec = self.engine, TRACES[trace]
        engine.recall = Recall(BUDGET if mode == "recall" else 0)
        sampling = Sampling(temperature=0.8, seed=1) if spec.free else Sampling(temperature=0)
        tools = ToolChoice((Tool("run_shell", "Run a shell command in the project", SHELL),), "required") \
            if spec.tools else None
        tokens, ms, answers = 0, 0.0, []
        for i, text in enumerate(spec.asks):
            messages = [{"role": "system", "content": f"You are a coding agent in /home/dev/project. Session {i}."},
                        {"role": "user", "content": text}]
            req = engine.request(messages, max_tokens=TOKENS, sampling=sampling, ignore_eos=not (spec.free or spec.tools),
                                 tools=tools, draft=None if mode == "plain" else "lookup")
            events = list(engine.stream(req))
            final = events[-1]
            assert isinstance(final, FinalEvent)
            answers.append([e.token for e in events if isinstance(e, TokenEvent)])
            if i >= spec.seed:
                tokens, ms = tokens + final.timings.decode_tokens, ms + final.timings.decode_ms
        self.answers[(trace, mode)] = answers
        return tokens / (ms / 1000)


def main() -> int:
    from benchmarks.overhead import default_model
    from tallow.runtime.engine import Engine
    from tallow.runtime.types import LoadSettings

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--model", type=Path, help="the target (default: the default model at F32)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        model = args.model or f32_model(default_model(), Path(scratch))
        print(f"target {model.name}, {model.stat().st_size / 1e6:.0f} MB; {TOKENS} tokens a request, greedy")
        verdicts = []
        with Engine(model, LoadSettings(n_ctx=4096, n_threads=2)) as engine:
            traces = Traces(engine)
            wanted = [("regenerate", "plain", 1.5), ("tool loop", "plain", 1.5), ("free text", "plain", 0.97),
                      ("regenerate", "lookup", 1.0), ("tool loop", "lookup", 1.0), ("edit loop", "lookup", 1.0)]
            for trace, against, target in wanted:
                arms = {"reference": against, "subject": "recall"}
                verdicts.append(compare(Comparison(f"{trace}: recall / {against}",
                                                   lambda arm: traces.rate(trace, arms[arm]),  # noqa: B023
                                                   target=target, lower_is_better=False, rounds=args.rounds,
                                                   max_rounds=2 * args.rounds, unit=" tok/s")))
        # greedy traces only: a sampled one can part where rounding moves a draw across a boundary
        parted = [key for key in traces.answers if not TRACES[key[0]].free
                  and traces.answers[key] != traces.answers[(key[0], "recall")]]
        print("greedy answers identical in every arm" if not parted else f"answers differ from recall's: {parted}")
    code = exit_code(verdicts)
    return code if not parted else max(code, 1)


if __name__ == "__main__":
    sys.exit(main())

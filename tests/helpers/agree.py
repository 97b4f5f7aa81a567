"""Greedy answers that must be the same but may round apart: two kernels (a GPU backend and
the CPU's, a drafted batch and a single row) can sum in another order, so a greedy answer may
part from another where two tokens are nearly tied. They must be equal, or part only at a
token whose two best log-probabilities are within TIE of each other on the reference side."""

from __future__ import annotations

TIE = 0.5  # nats between the reference's two best tokens where rounding may choose apart


def agree_or_tie(reference: dict, other: dict) -> None:
    """Two `run --json --logprobs 2` answers (or records with logprobs.content)."""
    a, b = reference["logprobs"]["content"], other["logprobs"]["content"]
    for i, (x, y) in enumerate(zip(a, b)):
        if x["token"] != y["token"]:
            best = sorted((t["logprob"] for t in x["top_logprobs"]), reverse=True)
            assert len(best) > 1 and best[0] - best[1] < TIE, f"token {i}: {x['token']!r} vs {y['token']!r}, no tie"
            return
    assert reference["text"] == other["text"]

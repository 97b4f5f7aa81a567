"""Speculative decoding without a second model: drafts found in the prompt and output so far.

When the answer repeats text the model has seen (a corrected copy, code being edited, a
quote), the tokens after the latest occurrence of the last few tokens are a good guess.
A drafted step (the engine's and the scheduler's alike) evaluates the sampled token and
the guess in one batch and keeps the guessed tokens the model itself would have chosen:
each position is sampled from its own logits, exactly as plain decoding would, so at
temperature 0 the output is the same token for token; a batch of k costs less than k
separate decodes.
"""

from __future__ import annotations

from tallow.runtime.drafting.recall import Memory

MAX_NGRAM = 4
MIN_NGRAM = 3
MAX_DRAFT = 64  # doubled from 2 on every wholly right draft, halved on a miss
START_DRAFT = 2


class NgramIndex:
    """For each n-gram (n = MIN_NGRAM..MAX_NGRAM), where its most recent continuation starts."""

    def __init__(self, tokens: list[int]) -> None:
        self.tokens: list[int] = []
        self.maps: dict[int, dict[tuple[int, ...], int]] = {n: {} for n in range(MIN_NGRAM, MAX_NGRAM + 1)}
        for t in tokens:
            self.append(t)

    def append(self, token: int) -> None:
        toks, at = self.tokens, len(self.tokens)
        for n, index in self.maps.items():
            if at >= n:
                index[tuple(toks[at - n:])] = at  # this n-gram is (now) followed by the token at `at`
        toks.append(token)

    def propose(self, limit: int) -> list[int]:
        return self.continuation(self.tokens, limit)

    def continuation(self, context: list[int], limit: int) -> list[int]:
        """What followed, in this index's tokens, the longest n-gram that ends `context`."""
        for n in range(MAX_NGRAM, MIN_NGRAM - 1, -1):
            if len(context) < n:
                continue
            start = self.maps[n].get(tuple(context[-n:]))
            if start is not None:
                return self.tokens[start:start + limit]
        return []


class LookupDrafter:
    """One request's drafts: the tokens that followed the latest occurrence of its last few
    tokens, in its own prompt and output, else in the model's memory of earlier requests
    (runtime/drafting/recall.py), which it adds its own to. On a CPU a batch of k tokens
    costs much more than one, so the draft length adapts: it doubles while every guess
    holds and halves after a miss."""

    def __init__(self, prompt: list[int], prediction: tuple[int, ...] | list[int] = (),
                 memory: Memory | None = None, usage=None) -> None:
        self.index = NgramIndex(prompt)
        # A predicted answer is where drafts come from instead: it follows the prompt's last
        # tokens, so its own index starts with them and drafts from its first token on.
        self.reference = NgramIndex([*prompt[-MAX_NGRAM:], *prediction]) if prediction else None
        self.limit = START_DRAFT
        self.memory, self.usage = memory, usage  # usage: its cached_tokens, known once the prompt is
        self.record = memory.open() if memory is not None else 0
        self.recorded = False  # the prompt's evaluated part is in the memory

    def extend(self, tokens) -> None:
        tokens = list(tokens)
        for t in tokens:
            self.index.append(t)
        memory = self.memory
        if memory is None:
            return
        if not self.recorded:  # what the prompt evaluated: the cached part came from a request remembered before
            self.recorded = True
            cached = (self.usage.cached_tokens or 0) if self.usage is not None else 0
            prompt = len(self.index.tokens) - len(tokens)
            memory.append(self.record, self.index.tokens[min(cached, prompt):prompt])
        memory.append(self.record, tokens)

    def propose(self, room: int) -> list[int]:
        if room <= 0:
            return []
        limit = min(self.limit, room)
        if self.reference is not None:  # drafts from the prediction alone, so usage counts what it gave
            return self.reference.continuation(self.index.tokens, limit)
        found = self.index.propose(limit)
        if not found and self.memory is not None:
            found = self.memory.continuation(self.index.tokens, limit)
        return found

    def outcome(self, accepted: int, proposed: int) -> None:
        if accepted < proposed:
            self.limit = max(1, self.limit // 2)
        elif proposed:
            self.limit = min(MAX_DRAFT, self.limit * 2)

    def observe_step(self, sequences: int, rows: int, ms: float) -> None:
        """A timed decode call (a draft model learns its costs from these; a lookup costs nothing to draft)."""

    def observe_whole(self, sequences: int, call_ms: float, wall_ms: float) -> None:
        """A whole timed step, drafts to sampling (see observe_step)."""


def verify(draft: list[int], sample) -> tuple[list[int], int]:
    """Check a draft evaluated after the last sampled token: `sample(i)` is the model's token
    from logit row i (row 0 follows that token, row i follows guess i-1). Returns the guesses
    the model confirms and the token it chose after them; each position is sampled from its
    own logits, exactly as plain decoding would sample it."""
    for i, guess in enumerate(draft):
        actual = sample(i)
        if actual != guess:
            return draft[:i], actual
    return list(draft), sample(len(draft))

"""Speculative decoding without a second model: drafts found in the prompt and output so far.

When the answer repeats text the model has seen (a corrected copy, code being edited, a
quote), the tokens after the latest occurrence of the last few tokens are a good guess.
The engine evaluates the sampled token and the guess in one batch and keeps the guessed
tokens the model itself would have chosen: each position is sampled from its own logits,
exactly as plain decoding would, so at temperature 0 the output is the same token for
token; a batch of k costs less than k separate decodes.
"""

from __future__ import annotations

from typing import Iterator

from .types import TokenEvent

MAX_NGRAM = 4
MIN_NGRAM = 3
MAX_DRAFT = 8
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
        toks = self.tokens
        for n in range(MAX_NGRAM, MIN_NGRAM - 1, -1):
            if len(toks) < n:
                continue
            start = self.maps[n].get(tuple(toks[-n:]))
            if start is not None:
                return toks[start:start + limit]
        return []


def lookup_decode(engine, run, sampler) -> Iterator[TokenEvent]:
    ctx, kv, take, seq = engine.ctx, engine.kv, engine.take, 0
    index = NgramIndex(run.request.prompt_tokens)
    usage = run.usage
    pending, idx = None, -1
    # On a CPU a batch of k tokens costs much more than one, so the draft length adapts:
    # it doubles while every guess holds and halves after a miss.
    limit = START_DRAFT
    while True:
        token = pending if pending is not None else sampler.sample(ctx, idx)
        pending = None
        event, done = take(run, token)
        if event is not None:
            yield event
        if done:
            return
        index.append(token)
        room = engine.n_ctx - len(kv) - 1
        if room < 0:
            run.finish = "length"
            return
        draft = index.propose(min(limit, room, engine.n_batch - 1))
        base = len(kv)
        engine.pace()
        ctx.decode([token, *draft], base, seq, all_logits=True)
        kv.append(token)
        kv.extend(draft)
        usage.draft_tokens += len(draft)
        idx = len(draft)  # if every guess holds, the next token comes from the last position
        for i, guess in enumerate(draft):
            actual = sampler.sample(ctx, i)
            if actual != guess:
                ctx.seq_rm(seq, base + 1 + i, -1)  # drop the wrong guesses' cells
                del kv[base + 1 + i:]
                pending = actual
                limit = max(1, limit // 2)
                break
            usage.accepted_tokens += 1
            event, done = take(run, guess)
            if event is not None:
                yield event
            index.append(guess)
            if done:  # like plain decoding, the last token taken is not kept in the KV cache
                ctx.seq_rm(seq, base + 1 + i, -1)
                del kv[base + 1 + i:]
                return
        else:
            if draft:
                limit = min(MAX_DRAFT, limit * 2)

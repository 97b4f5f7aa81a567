"""The sequence core that every route decodes through (docs/DESIGN.md, "The sequence core").

- `Sequence`: one llama.cpp sequence and the tokens its KV cells hold, in order, with the
  position of each (a media chunk may take fewer positions than cells: M-RoPE); prefix
  reuse, trimming, and state save/load for the disk prompt cache.
- `DiskPrefixes`: a PromptCache bound to one context's fingerprint; loads the longest saved
  prefix of a prompt into a sequence and saves a finished request's prefixes from one.
- `OutputStream`: one request's answer as it streams: sampled token -> detokenizer -> stop
  strings -> reasoning split -> usage and timings -> events (log-probabilities included).

The engine drives one Sequence (run, chat); the scheduler drives one per slot (serve, batch).
Both call the same methods here, so a feature of the core exists on every route.
"""

from __future__ import annotations

import time
from pathlib import Path

from tallow.runtime.checkpoints import Checkpoints
from tallow.runtime.drafting.speculative import LookupDrafter, verify
from tallow.runtime.logprobs import with_logprobs, with_post_probs
from tallow.runtime.media.spans import Span, snap, text_only
from tallow.runtime.text import Detokenizer, ReasoningSplitter, StopMatcher
from tallow.runtime.types import FinalEvent, ProgressEvent, Request, Timings, TokenEvent, Usage


def common_prefix(a: list[int], b: list[int]) -> int:
    """How many leading tokens two sequences share (the KV cells a prompt can reuse)."""
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class Sequence:
    """One sequence of a llama.cpp context: its id and the tokens its KV cells hold.

    Cell i sits at position i, except after a media chunk that libmtmd places on fewer (or
    more) positions than it has tokens: Qwen2-VL's M-RoPE puts a picture's tokens on a grid
    and the text after it max(rows, columns) positions on. `_jumps` lists each such chunk as
    (the cell after it, positions gained or lost), so a position is the cell index plus the
    jumps before it; llama.cpp's seq_rm and decode take positions, the lists here cells.

    A model whose cache cannot be cut back (recurrent layers: Model.rewinds) keeps
    `checkpoints`, copies of its state taken by `mark`; `keep` then restores the longest.
    """

    def __init__(self, ctx, seq: int) -> None:
        self.ctx = ctx
        self.seq = seq
        self.kv: list[int] = []
        self._jumps: list[tuple[int, int]] = []
        self.checkpoints = None if ctx.rewinds else Checkpoints()

    def pos(self, cell: int) -> int:
        """The position of cell `cell` (of the next one, for len(kv))."""
        return cell + sum(extra for at, extra in self._jumps if at <= cell)

    @property
    def next_pos(self) -> int:
        return self.pos(len(self.kv))

    def placed(self, tokens: list[int], next_pos: int) -> None:
        """A media chunk's cells were just evaluated, as `tokens`; libmtmd says where the next
        cell goes."""
        extra = next_pos - self.next_pos - len(tokens)
        self.kv.extend(tokens)
        if extra:
            self._jumps.append((len(self.kv), extra))

    def keep(self, n: int) -> int:
        """Drop every cell from cell n on (never inside a media chunk: see multimodal.snap).
        Returns how many cells the sequence holds now: n, or where the cache cannot be cut
        back, the longest checkpoint's length up to n (0: none, the sequence is cleared)."""
        if n >= len(self.kv):
            return len(self.kv)
        if not self.ctx.seq_rm(self.seq, self.pos(n), -1):
            n = self._rewind(n)
        del self.kv[n:]
        self._jumps = [(at, extra) for at, extra in self._jumps if at <= n]
        if self.checkpoints is not None:
            self.checkpoints.drop_after(n)
        return n

    def _rewind(self, n: int) -> int:
        """Restore the longest checkpoint of at most n cells (dropping a hybrid model's
        attention cells past it); returns its length, or 0 after clearing the sequence."""
        found = self.checkpoints.best(n) if self.checkpoints is not None else None
        if found is not None and self.ctx.restore(self.seq, found[1]) \
                and self.ctx.seq_rm(self.seq, self.pos(found[0]), -1):
            return found[0]
        self.ctx.seq_rm(self.seq, 0, -1)
        return 0

    def mark(self) -> None:
        """Keep a checkpoint of what the sequence holds now (only where it cannot be cut back)."""
        if self.checkpoints is not None and self.kv:
            self.checkpoints.add(len(self.kv), self.ctx.snapshot(self.seq))

    def clear(self) -> None:
        self.ctx.seq_rm(self.seq, 0, -1)
        self.kv.clear()
        self._jumps.clear()
        if self.checkpoints is not None:
            self.checkpoints.clear()

    def copy_from(self, other: Sequence) -> None:
        """Hold what `other` holds: a fork of its prompt, with no prefill of its own."""
        self.clear()
        self.ctx.seq_cp(other.seq, self.seq)
        self.kv.extend(other.kv)
        self._jumps = list(other._jumps)
        if other.checkpoints is not None:
            self.checkpoints = other.checkpoints.copy()

    def reusable(self, prompt: list[int]) -> int:
        """How many of the prompt's tokens the cells hold already; never all of them, since the
        last prompt token must be evaluated again for its logits."""
        return min(common_prefix(self.kv, prompt), len(prompt) - 1)

    def usable(self, prompt: list[int]) -> int:
        """How many of the prompt's tokens this sequence would keep: `reusable`, or where the
        cache cannot be cut back and the prompt parts from it, the longest checkpoint's."""
        n = self.reusable(prompt)
        return n if self.checkpoints is None or n >= len(self.kv) else self.checkpoints.longest(n)

    def load(self, path: Path, tokens: list[int], spans: tuple[Span, ...] = ()) -> bool:
        """Replace the sequence's cells with a saved state that must hold exactly `tokens`, a
        prefix of the prompt whose media `spans` are given (the state keeps their positions)."""
        self.clear()
        loaded = self.ctx.load_seq(path, self.seq, len(tokens))
        if loaded != tokens:  # refused, or not what the record says: never use it
            self.clear()
            return False
        self.kv.extend(loaded)
        self._jumps = [(s.end, s.n_pos - s.n) for s in spans if s.end <= len(tokens) and s.n_pos != s.n]
        self.mark()
        return True

    def save(self, path: Path) -> int:
        return self.ctx.save_seq(path, self.seq, self.kv)


class DiskPrefixes:
    """The disk prompt cache as one context sees it: entries under this context's fingerprint."""

    def __init__(self, cache, fingerprint: str) -> None:
        self.cache = cache
        self.fingerprint = fingerprint

    def applies(self, request: Request) -> bool:
        return request.disk_cache

    def saves_prompt(self, request: Request) -> bool:
        """Whether the whole prompt will be saved when the request finishes (its last token is
        then evaluated alone, as a later run that loads the prefix must: see `save`)."""
        return request.disk_cache and request.save_prompt and len(request.prompt_tokens) > self.cache.min_tokens

    def prefixes(self, request: Request) -> list[int]:
        """The prefix lengths to save when the request finishes, longest first."""
        if not request.disk_cache:
            return []
        ends = {n for n in request.cache_points if self.cache.min_tokens <= n < len(request.prompt_tokens)}
        if self.saves_prompt(request):
            ends.add(len(request.prompt_tokens) - 1)
        return sorted(ends, reverse=True)

    def points(self, request: Request, start: int) -> list[int]:
        """Cache points past `start` that are not on disk yet, shortest first: the prefill stops
        at each and saves it there, while the sequence holds exactly that prefix, so nothing
        is trimmed afterwards (an agent's next turn finds its whole conversation in memory)."""
        if not request.disk_cache:
            return []
        prompt, cache = request.prompt_tokens, self.cache
        return sorted(n for n in set(request.cache_points)
                      if start < n < len(prompt) and n >= cache.min_tokens and not cache.has(self.fingerprint, prompt[:n]))

    def save_point(self, seq: Sequence, request: Request, n: int) -> bool:
        """Save the first `n` prompt tokens, which the sequence holds and nothing more."""
        tokens = request.prompt_tokens[:n]
        if seq.kv != tokens:
            return False
        return self.cache.put(self.fingerprint, tokens, seq.save) is not None

    def load_longest(self, seq: Sequence, request: Request, cached: int, usage: Usage) -> int:
        """Load the longest saved prefix of the request's prompt that beats the `cached` tokens
        memory holds; returns the tokens now cached (and sets usage.cache_source to 'disk' when
        one was loaded)."""
        cache, prompt = self.cache, request.prompt_tokens
        for entry in cache.lookup(self.fingerprint, prompt):  # longest first
            if len(entry.tokens) <= cached + 1:
                break
            if seq.checkpoints is not None and len(entry.tokens) >= len(prompt):
                continue  # a recurrent state could not be cut back to evaluate the last token again
            if not cache.verify(entry):  # a damaged one is removed and the next tried
                continue
            if not seq.load(entry.state_path, entry.tokens, request.media):
                cache.remove(entry)
                usage.cache_source = None
                cached = 0  # what memory held went with the failed load
                continue
            cache.touch(entry)
            usage.cache_source = "disk"
            return min(len(entry.tokens), len(prompt) - 1)
        return cached

    def save(self, seq: Sequence, request: Request) -> int:
        """Save the request's prompt and its cache points (after the answer, so it never delays
        one); returns how many entries were written.

        The sequence is trimmed to each prefix in turn, longest first, and saved; afterwards
        it holds the shortest prefix saved. The longest is the whole prompt but its last
        token: a later request loads it and evaluates that token into the very next cell, as
        this one did (no hole left by trimming, which would shift llama.cpp's summation order
        and, at temperature 0, the answer).
        """
        cache, prompt, written = self.cache, request.prompt_tokens, 0
        for n in self.prefixes(request):
            tokens = prompt[:n]
            if seq.kv[:n] != tokens or cache.has(self.fingerprint, tokens):
                continue
            if seq.keep(n) == n:  # (a recurrent state goes back only as far as a checkpoint)
                written += cache.put(self.fingerprint, tokens, seq.save) is not None
        return written


class OutputStream:
    """The mutable state of one request while it streams: detokenizer, stop strings, reasoning
    split, usage and timings. `take` accounts for each sampled token; `final` closes it."""

    def __init__(self, request: Request, model, timings: Timings | None = None) -> None:
        self.request = request
        self.model = model
        self.kept: dict[int, tuple] = {}  # post-sampling probabilities by logit row (runtime/backend/sampler.py)
        self.timings = timings if timings is not None else Timings()
        self.usage = Usage(prompt_tokens=len(request.prompt_tokens))
        self.started = time.perf_counter()
        self.t_decode_start: float | None = None
        self.t_last: float | None = None
        self.n_out = 0
        self.parts: list[str] = []
        self.finish = "stop"
        self.hit_stop_string = False
        self.detok = Detokenizer()
        self.stops = StopMatcher(list(request.stop))
        markers = request.reasoning_markers
        self.splitter = ReasoningSplitter(*markers, inside=request.starts_in_reasoning) if markers else None
        self.reasoning_parts: list[str] = []
        # a reasoning budget: the closing marker's tokens, forced in once the budget would be spent
        self._closing = model.tokenize(markers[1], add_special=False, parse_special=True) \
            if markers and request.reasoning_budget is not None else []
        self._forced: list[int] = []
        self._budget_check()

    def _budget_check(self) -> None:
        """Inside the reasoning, with only room left for its closing marker: force it next."""
        budget = self.request.reasoning_budget  # set whenever there are closing tokens
        if self._closing and not self._forced and self.splitter is not None and self.splitter.inside \
                and self.usage.reasoning_tokens + len(self._closing) >= (budget or 0):
            self._forced = list(self._closing)

    def forced_token(self) -> int | None:
        """The next token the answer must take instead of a sampled one (the sampler asks)."""
        return self._forced.pop(0) if self._forced else None

    def progress(self, processed: int) -> ProgressEvent:
        """The prompt's progress, `processed` of its tokens in the context."""
        return ProgressEvent(len(self.request.prompt_tokens), self.usage.cached_tokens or 0, processed)

    def decoding(self) -> None:
        """Prefill is over: the first token is about to be sampled."""
        now = time.perf_counter()
        self.timings.prefill_ms = (now - self.started - self.timings.queue_ms / 1000) * 1000
        self.t_decode_start = now

    def take(self, token: int) -> tuple[TokenEvent | None, bool]:
        """Account for one sampled token: (its event, whether the answer is over)."""
        now = time.perf_counter()
        if self.model.is_eog(token):
            self.finish = "stop"
            return None, True
        if self.t_last is None:
            self.timings.ttft_ms = (now - self.started) * 1000
        else:
            self.timings.itl_ms.append((now - self.t_last) * 1000)
        self.t_last = now
        self.n_out += 1
        text, stopped = self.stops.push(self.detok.push(self.model.piece(token)))
        reasoning = ""
        if self.splitter is not None:
            text, reasoning, touched = self.splitter.push(text)
            self.usage.reasoning_tokens += touched
            if reasoning:
                self.reasoning_parts.append(reasoning)
            self._budget_check()
        if text:
            self.parts.append(text)
        if stopped:
            self.finish, self.hit_stop_string = "stop", True
            return TokenEvent(text, token, reasoning), True
        max_tokens = self.request.max_tokens
        if max_tokens is not None and self.n_out >= max_tokens:
            self.finish = "length"
            return TokenEvent(text, token, reasoning), True
        return TokenEvent(text, token, reasoning), False

    def take_all(self, ctx, sampled: list[tuple[int, int]], guesses: int = 0) -> tuple[list[TokenEvent], int | None]:
        """Take tokens sampled in one step, in order, as (logit row, token), the first `guesses`
        of them confirmed draft tokens: their events (with log-probabilities read from those
        rows when asked for), and how many were taken if the answer ended among them (None:
        it goes on). Only draft tokens that made it into the answer count as accepted."""
        events, top = [], self.request.logprobs
        for n, (row, token) in enumerate(sampled, 1):
            self.usage.accepted_tokens += n <= guesses
            event, done = self.take(token)
            if event is not None:
                if top is not None and self.request.post_probs:
                    event = with_post_probs(event, self.kept.pop(row, None))
                elif top is not None:  # before the next decode replaces the logits
                    event = with_logprobs(event, ctx.logit_row(row, self.model.n_vocab), top)
                events.append(event)
            if done:
                return events, n
        return events, None

    def final(self) -> FinalEvent:
        tail = reasoning_tail = ""
        if not self.hit_stop_string:
            # Release what was held back: an incomplete character, a possible stop prefix.
            tail, stopped = self.stops.push(self.detok.flush())
            if not stopped:
                tail += self.stops.flush()
        if self.splitter is not None:
            answer, reasoning_tail, _ = self.splitter.push(tail)
            held_answer, held_reasoning = self.splitter.flush()
            tail, reasoning_tail = answer + held_answer, reasoning_tail + held_reasoning
            self.reasoning_parts.append(reasoning_tail)
        self.parts.append(tail)
        t = self.timings
        t.decode_tokens = self.n_out
        if self.t_decode_start is not None and self.t_last is not None:
            t.decode_ms = (self.t_last - self.t_decode_start) * 1000
        t.total_ms = (time.perf_counter() - self.started) * 1000
        self.usage.completion_tokens = self.n_out
        return FinalEvent("".join(self.parts), self.finish, self.usage, t, tail, "".join(self.reasoning_parts),
                          reasoning_tail, self.stops.matched)


class Stops:
    """Where a request's prefill pauses, each a chunk's end: the disk cache points to save
    there (DiskPrefixes.points) and, for a cache that cannot be cut back, the checkpoints to
    take (where a turn begins, and the whole prompt but its last token: the next turn, or the
    same prompt again, resumes there)."""

    def __init__(self, seq: Sequence, request: Request, disk: DiskPrefixes | None, points: list[int],
                 cached: int) -> None:
        self.seq, self.request, self.disk, self.points = seq, request, disk, points
        ends = {*request.turns, len(request.prompt_tokens) - 1} if seq.checkpoints is not None else set()
        self.marks = sorted({m for m in (snap(n, request.media) for n in ends) if m > cached})

    def all(self) -> list[int]:
        return sorted({*self.points, *self.marks})

    def next(self) -> int | None:
        return min([*self.points[:1], *self.marks[:1]], default=None)

    def reached(self) -> None:
        """The prefill just evaluated a chunk: save or checkpoint what ends there."""
        n = len(self.seq.kv)
        while self.points and n >= self.points[0]:
            assert self.disk is not None  # cache points come from the disk cache
            self.disk.save_point(self.seq, self.request, self.points.pop(0))
        if n in self.marks:
            self.seq.mark()
        self.marks = [m for m in self.marks if m > n]


def begin_request(seq: Sequence, run: OutputStream, disk: DiskPrefixes | None, sampler) -> tuple[int, Stops]:
    """What every driver does before a request's prefill, written once: reuse the prefix the
    sequence holds, load a longer one from disk when there is one, prime the sampler's
    repetition window with the prompt, and count it all in the request's usage. Returns the
    prompt tokens the sequence holds now and where the prefill should pause (Stops)."""
    request = run.request
    prompt = request.prompt_tokens
    cached = snap(seq.usable(prompt), request.media) if request.reuse_cache else 0
    run.usage.cache_source = "memory" if cached else None
    from_disk = disk is not None and disk.applies(request) and request.reuse_cache
    if disk is not None and from_disk:
        cached = snap(disk.load_longest(seq, request, cached, run.usage), request.media)
    cached = seq.keep(cached)  # less, where a recurrent state goes back to a checkpoint
    if not cached:
        run.usage.cache_source = None
    run.usage.media_tokens = sum(span.n for span in request.media)
    run.usage.audio_tokens = sum(span.n for span in request.media if span.kind == "audio")
    run.usage.cached_tokens = cached
    run.timings.prefill_tokens = len(prompt) - cached
    s = request.sampling
    if s.penalized and s.repeat_last_n:  # (a window of 0 looks at nothing; [-0:] would be the whole prompt)
        for t in text_only(prompt)[-s.repeat_last_n:]:
            sampler.accept(t)
    points = disk.points(request, cached) if disk is not None and from_disk else []
    return cached, Stops(seq, request, disk, points, cached)


def settle_draft(seq: Sequence, run: OutputStream, drafter: LookupDrafter, draft: list[int],
                 sample_row) -> tuple[list[int], int]:
    """A drafted step's outcome, for both drivers: the guesses the model confirms (each row
    sampled as plain decoding would, `sample_row(i)`), the token it chose after them; the
    wrong guesses' cells are dropped, and the drafter adapts its length."""
    accepted, after = verify(draft, sample_row)
    seq.keep(len(seq.kv) - len(draft) + len(accepted))
    run.usage.draft_tokens += len(draft)
    run.usage.draft_steps += bool(draft)
    drafter.outcome(len(accepted), len(draft))
    return accepted, after

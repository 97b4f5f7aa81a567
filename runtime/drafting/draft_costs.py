"""What drafting costs on this machine, measured as it runs (docs/DESIGN.md, "Draft-model
drafts").

The draft length rule weighs the draft's calls and the verified rows against a plain
decode. Priors from the weights' sizes and a CPU measurement are wrong in both directions
elsewhere: a quantized draft costs more than its size says (a small model's call is mostly
overhead), a target's extra rows cost less each the more there are (two rows of an F16
model on 2 cores cost 1.5 decodes, seventeen cost 4.2), and on a GPU a row costs almost
nothing. So the decode calls that drafting makes are timed:

- the target's calls that only decode, by their number of rows n: T(n). A plain step of B
  sequences costs T(B); B sequences verifying k drafted tokens more, T(B + k). Between
  measured row counts T is interpolated, past the largest it goes on at the last slope;
- the draft's catch-up call (what it has not seen, a token or two) gives the first drafted
  token's cost, and each further draft call (a token for each drafting sequence) the rest's.

Each is an exponential moving average; until a figure has been seen, its prior stands.

The calls are not the whole of what drafting costs: each verified row is sampled, the
draft's weights push the target's out of the CPU's caches, and Python runs between the
calls. So whole steps are timed too, end to end (drafts, decode, sampling): a plain step's
wall time, and a drafted step's, whose excess over a plain one, divided by what its calls
took beyond a plain one's, is a scale that every cost is multiplied by.
"""

from __future__ import annotations

import bisect

WEIGHT = 0.2  # of the latest observation in each average
SCALE_RANGE = (0.5, 4.0)  # a whole step's excess over what its calls took: bounds of the believable
ROW_PRIOR = 0.5  # a verified row, in decodes: 13 ms for 1 token, 58 ms for 8 (2 CPU cores, depth 1,200)


def row_cost(busy: int) -> float:
    """The prior of a verified row's cost, in this sequence's share of a step, when `busy`
    sequences decode together: a step of B rows costs about 1 + ROW_PRIOR (B - 1) decodes,
    each sequence's share is that over B, and one more row adds ROW_PRIOR to the whole step."""
    return ROW_PRIOR * busy / (1 + ROW_PRIOR * (busy - 1))


def _ema(old: float | None, new: float) -> float:
    return new if old is None else old + WEIGHT * (new - old)


class StepCosts:
    """The measured call, draft and whole-step costs of one target context and its draft."""

    def __init__(self, draft_prior: float) -> None:
        self.draft_prior = draft_prior  # a draft token in decodes, from the weights' sizes
        self.calls: dict[int, float] = {}  # n -> ms of a target call of n rows that only decodes
        self.known: list[int] = []  # the row counts in `calls`, in order (kept as they are added)
        self.catch_ms: dict[int, float] = {}  # B -> ms of the draft's catch-up call: its first token's logits
        self.token_ms: dict[int, float] = {}  # B -> ms of a draft call for each further token
        self.wall: dict[int, float] = {}  # B -> ms of a whole plain step (no draft call in it)
        self.scale = 1.0  # a drafted step's measured excess over a plain one, over what its calls took
        self.pending_ms = 0.0  # the draft calls of the step in progress

    def target_step(self, sequences: int, rows: int, ms: float) -> None:
        """A decode call of `rows` rows for `sequences` decoding sequences (no prefill in it)."""
        if sequences >= 1 and rows >= sequences:
            if rows not in self.calls:
                bisect.insort(self.known, rows)
            self.calls[rows] = _ema(self.calls.get(rows), ms)

    def catch_up(self, sequences: int, ms: float) -> None:
        """The draft's call that evaluates what it has not seen, for `sequences` sequences."""
        self.catch_ms[sequences] = _ema(self.catch_ms.get(sequences), ms)

    def draft_token(self, sequences: int, ms: float) -> None:
        """A draft call of one more token for each of `sequences` sequences."""
        self.token_ms[sequences] = _ema(self.token_ms.get(sequences), ms)

    def drafting(self, ms: float) -> None:
        """The draft model's calls took `ms` in the step in progress."""
        self.pending_ms += ms

    def whole_step(self, busy: int, target_ms: float | None, wall_ms: float) -> None:
        """A step of `busy` decoding sequences ended: its target call took `target_ms`, the
        whole of it `wall_ms` (the draft calls it made were reported by `drafting`); None: it
        evaluated a prompt too, and says nothing of decoding's costs."""
        drafted, self.pending_ms = self.pending_ms, 0.0
        if target_ms is None:
            return
        if not drafted:
            self.wall[busy] = _ema(self.wall.get(busy), wall_ms)
            return
        base_wall, base_call = self.wall.get(busy), self.calls.get(busy)
        if base_wall is None or base_call is None:
            return
        calls = drafted + max(0.0, target_ms - base_call)
        low, high = SCALE_RANGE
        self.scale = _ema(self.scale, min(high, max(low, (wall_ms - base_wall) / calls)))

    def call_ms(self, rows: int) -> float | None:
        """T(rows): measured, else interpolated between the nearest measured row counts, else
        carried on from the largest at the slope of the last two (or the prior's); None
        before anything is measured at or below `rows`."""
        if rows in self.calls:
            return self.calls[rows]
        known = self.known
        at = bisect.bisect_left(known, rows)
        if at == 0:
            return None
        lo = known[at - 1]
        if at < len(known):
            hi = known[at]
            return self.calls[lo] + (self.calls[hi] - self.calls[lo]) * (rows - lo) / (hi - lo)
        if at >= 2:
            prev = known[at - 2]
            slope = max(0.0, (self.calls[lo] - self.calls[prev]) / (lo - prev))
        else:
            slope = ROW_PRIOR * self.calls[lo] / lo
        return self.calls[lo] + slope * (rows - lo)

    def rows(self, busy: int, k: int) -> float:
        """k more verified rows in a step of `busy` sequences, in one sequence's share of it."""
        step, more = self.call_ms(busy), self.call_ms(busy + k)
        if step is None or more is None or len(self.calls) < 2:
            return k * row_cost(busy)
        return self.scale * (more - step) / (step / busy)

    def draft(self, busy: int) -> tuple[float, float]:
        """(the first drafted token, each further one), in this sequence's share of a step
        with `busy` sequences. The first costs the catch-up call, which evaluates a token or
        two (the last accepted and the target's own), so more than the rest do. Until a
        call for this many has been timed, a lone sequence's stands for it, unshared: a busy
        step's drafts cost no less a sequence than that (a probe pays it alone)."""
        step = self.call_ms(busy)
        first = self.catch_ms.get(busy, self.catch_ms.get(1))
        if step is None or first is None:
            return self.draft_prior, self.draft_prior
        # Until a further token has been timed, it is taken to cost what the first did: a
        # small model's decode call costs about the same for one token as for two.
        rest = self.token_ms.get(busy, self.token_ms.get(1, first))
        share = 1.0 if busy in self.catch_ms else float(busy)  # a lone call's cost is not shared
        return self.scale * first * share / step, self.scale * rest * share / step

    def reach(self, busy: int) -> int:
        """The most verified rows beyond `busy` whose call has been timed."""
        return max((n - busy for n in self.calls if n > busy), default=0)

    def measured(self, busy: int, longest: int) -> bool:
        """Everything a draft of `longest` tokens for one of `busy` sequences costs has been
        seen: this many sequences' plain step (or its neighbours'), the draft's calls, and for a lone sequence
        its verifying calls that far (longer drafts are tried only alone; with others
        sharing the step, the lone curve carried on stands for them)."""
        return self.call_ms(busy) is not None and 1 in self.catch_ms and (busy > 1 or self.reach(1) >= longest)

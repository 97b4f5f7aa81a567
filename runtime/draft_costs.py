"""What drafting costs on this machine, measured as it runs (docs/DESIGN.md, "Draft-model
drafts").

The draft length rule weighs a draft token's decode (c) and a verified row (r) against a
plain decode. Priors from the weights' sizes and a 2-core CPU measurement are wrong in
both directions elsewhere: a quantized draft costs more than its size says (dequantizing is
compute), an F16 target's extra rows cost less than a quantized one's, and on a GPU a row
costs almost nothing. So the decode calls that drafting already makes are timed:

- a plain step (B sequences, one row each) gives T(B), the step's cost;
- a verifying step (B sequences, B + k rows) gives k more rows over T(B): a row's cost;
- the draft's catch-up call (what it has not seen, a token or two) gives the first drafted
  token's cost, and each further draft call (a token for each drafting sequence) the rest's.

Each is an exponential moving average; until a figure has been seen, its prior stands.
"""

from __future__ import annotations

WEIGHT = 0.2  # of the latest observation in each average
ROW_PRIOR = 0.5  # a verified row, in decodes: 13 ms for 1 token, 58 ms for 8 (2 CPU cores, depth 1,200)


def row_cost(busy: int) -> float:
    """The prior of a verified row's cost, in this sequence's share of a step, when `busy`
    sequences decode together: a step of B rows costs about 1 + ROW_PRIOR (B - 1) decodes,
    each sequence's share is that over B, and one more row adds ROW_PRIOR to the whole step."""
    return ROW_PRIOR * busy / (1 + ROW_PRIOR * (busy - 1))


def _ema(old: float | None, new: float) -> float:
    return new if old is None else old + WEIGHT * (new - old)


class StepCosts:
    """The measured step, row and draft costs of one target context and its draft."""

    def __init__(self, draft_prior: float) -> None:
        self.draft_prior = draft_prior  # a draft token in decodes, from the weights' sizes
        self.plain: dict[int, float] = {}  # B -> ms of a step of B sequences, a row each
        self.row_ms: float | None = None  # ms of one more verified row
        self.catch_ms: dict[int, float] = {}  # B -> ms of the draft's catch-up call: its first token's logits
        self.token_ms: dict[int, float] = {}  # B -> ms of a draft call for each further token

    def target_step(self, sequences: int, rows: int, ms: float) -> None:
        """A decode call of `rows` rows for `sequences` decoding sequences (no prefill in it)."""
        if sequences < 1 or rows < sequences:
            return
        if rows == sequences:
            self.plain[sequences] = _ema(self.plain.get(sequences), ms)
        elif sequences in self.plain:
            self.row_ms = _ema(self.row_ms, max(0.0, ms - self.plain[sequences]) / (rows - sequences))

    def catch_up(self, sequences: int, ms: float) -> None:
        """The draft's call that evaluates what it has not seen, for `sequences` sequences."""
        self.catch_ms[sequences] = _ema(self.catch_ms.get(sequences), ms)

    def draft_token(self, sequences: int, ms: float) -> None:
        """A draft call of one more token for each of `sequences` sequences."""
        self.token_ms[sequences] = _ema(self.token_ms.get(sequences), ms)

    def row(self, busy: int) -> float:
        """One more verified row, in this sequence's share of a step with `busy` sequences."""
        step = self.plain.get(busy)
        if step is None or self.row_ms is None:
            return row_cost(busy)
        return self.row_ms / (step / busy)

    def draft(self, busy: int) -> tuple[float, float]:
        """(the first drafted token, each further one), in this sequence's share of a step
        with `busy` sequences. The first costs the catch-up call, which evaluates a token or
        two (the last accepted and the target's own), so more than the rest do."""
        step = self.plain.get(busy)
        if step is None:
            return self.draft_prior, self.draft_prior
        first, rest = self.catch_ms.get(busy), self.token_ms.get(busy)
        return (self.draft_prior if first is None else first / step,
                self.draft_prior if rest is None else rest / step)

    @property
    def measured(self) -> bool:
        """What a lone sequence's probe can measure has been seen (a further token's cost
        only shows once a draft is longer than one, so its prior may still stand)."""
        return 1 in self.plain and self.row_ms is not None and 1 in self.catch_ms

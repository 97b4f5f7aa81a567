"""Speculative decoding with a second, smaller model of the same vocabulary.

The draft model runs in a context of its own, one sequence per target sequence (the same
sequence ids), and keeps its KV cells between requests: before each draft it drops what
differs from the target's tokens and evaluates only the rest, so a chat never re-prefills
its history into the draft. It drafts greedily, stopping where its own top probability falls
under p_min. The target verifies the draft as it verifies lookup drafts
(runtime/drafting/speculative.verify: each position sampled from the target's own logits and the
draft kept while it agrees), so the answer is the target's, token for token, at any
temperature and seed.

Drafting costs the draft's decodes plus the verification's extra rows; it pays only when
enough of the draft is accepted. Each sequence estimates its per-token acceptance `a` and
picks the draft length k that maximises the expected tokens per unit of work,
(1 - a^(k+1)) / (1 - a) against 1 + the draft's calls + the k verified rows (the
target's call at B + k rows over its call at B), in target-decode units; it drafts nothing
when no k beats plain decoding, probing with one token now and then so that it notices
when the text becomes predictable. A draft that is right 90% of the time drafts past the
longest timed call until long drafts' costs are known. In a busy step (many sequences
decoding together) a verified row costs more of a sequence's share, so drafting stops on
its own once enough sequences are busy. The costs are measured as it runs, calls and
whole steps (runtime/drafting/draft_costs.py).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path

from tallow.models.draft_pick import VOCAB_SIZE_TOLERANCE
from tallow.runtime.drafting.draft_costs import StepCosts, row_cost
from tallow.runtime.errors import DraftError
from tallow.runtime.sequence import Sequence, common_prefix
from tallow.runtime.types import ContextParams, DraftLimits

FIRST_CHECKED = 5  # token texts are compared from this id on: the first few are control tokens that models name apart
PROBE_EVERY = 32  # steps without a draft before one token is drafted to measure acceptance again
PROBE_MOST = 512  # ... four times as long after each probe that finds nothing, up to this
PROBE_WINDOW = 16  # a probe evaluates at most this much of the latest text, not all the draft missed
SMOOTHING = 0.3  # weight of the latest step in the acceptance estimate
ALWAYS_RIGHT = 0.99  # the acceptance of a draft that is (nearly) always right: the best a draft can do
EXPLORE_AT = 0.9  # at this acceptance a lone sequence drafts longer than the timed calls reach, to time them
FIRST_ACCEPTANCE = 0.7  # a new request's acceptance estimate
SELDOM = 1 / 8  # a tenant's share of tokens in runs under which a request does not probe at its first step
TENANTS = 64  # tenants whose drafts are remembered per draft model (the least recently seen forgotten)


def vocabulary_difference(target, draft) -> str | None:
    """The first way the draft model tokenizes differently from the target, in words; None
    when they agree (both are runtime.backend.Model)."""
    if abs(target.n_vocab - draft.n_vocab) > VOCAB_SIZE_TOLERANCE:
        return f"the target has {target.n_vocab} tokens but the draft {draft.n_vocab}"
    for what, a, b in (("begin-of-text token", target.bos, draft.bos), ("end-of-text token", target.eos, draft.eos),
                       ("adds a begin-of-text token", target.add_bos, draft.add_bos)):
        if a != b:
            return f"the {what} differs: {a} in the target, {b} in the draft"
    for i in range(FIRST_CHECKED, min(target.n_vocab, draft.n_vocab)):
        if target.piece(i) != draft.piece(i):
            return f"token {i} is {target.piece(i)!r} in the target but {draft.piece(i)!r} in the draft"
    return None


def best_length(acceptance: float, draft_cost: float, limit: int, busy: int = 1,
                rows: Callable[[int], float] | None = None, first: float | None = None) -> int:
    """The draft length with the most expected tokens per unit of work, with `busy`
    sequences sharing the step; 0 when none beats plain decoding (one token per unit). A
    busy step is already paid for by its other rows, so a draft's rows cost relatively more:
    at 8 sequences a row costs 0.89 of a sequence's share and drafting rarely pays. `rows`:
    the measured cost of k verified rows for that many (StepCosts.rows; else the prior's,
    k row_cost); `first`: the first drafted token's cost, when it differs from the rest's
    (`draft_cost`)."""
    a = min(max(acceptance, 0.0), 0.999)
    prior = row_cost(max(1, busy))
    cost = rows if rows is not None else (lambda k: k * prior)
    first = first if first is not None else draft_cost
    best, best_gain = 0, 1.0
    for k in range(1, limit + 1):
        gain = (1 - a ** (k + 1)) / (1 - a) / (1 + first + (k - 1) * draft_cost + cost(k))
        if gain > best_gain:
            best, best_gain = k, gain
    return best


def load_draft(paths: list[Path], target, target_paths: list[Path], p: ContextParams, limits: DraftLimits,
               gpu_layers: int, name: str | None = None, extra_buffers: bool = False) -> DraftContext:
    """The draft model, checked against the target (a runtime.backend.Model), and a context
    for it shaped as the target's (the same context length, batch and sequences). Its weights
    are repacked (`extra_buffers`) only where the target's are: the machine's calibration
    decides that once for both (llama.cpp's AMX repack crashes on some Xeons)."""
    from tallow.runtime import backend

    size = sum(f.stat().st_size for f in paths)
    target_size = sum(f.stat().st_size for f in target_paths)
    if size > target_size:
        raise DraftError(f"the draft {paths[0].name} ({size / 1e6:.0f} MB) is larger than the model it drafts for "
                         f"({target_size / 1e6:.0f} MB): it would cost more than it saves", "give a smaller draft model")
    model = backend.Model(paths, gpu_layers, extra_buffers=extra_buffers)
    try:
        problem = vocabulary_difference(target, model)
        if not model.rewinds:
            raise DraftError(f"{paths[0].name} has recurrent layers, whose state cannot drop a rejected guess",
                             "draft with a transformer model, or with --draft lookup")
        if problem is not None:
            raise DraftError(f"{paths[0].name} cannot draft for {target_paths[0].name}: {problem}",
                             "a draft model must share the target's vocabulary (the same family)")
        ctx = backend.Context(model, p)
    except BaseException:
        model.close()
        raise
    return DraftContext(model, ctx, limits, size / target_size, name or paths[0].name)


class Tally:
    """One request's drafts: the accepted tokens past each draft's first (runs of right
    guesses), and the tokens written."""

    __slots__ = ("runs", "written")

    def __init__(self) -> None:
        self.runs = self.written = 0


class TenantPriors:
    """How soon a tenant's new request probes again after a wrong guess: its patience, from
    the share of its earlier requests' tokens that came in runs of right guesses (accepted
    past a draft's first token), the latest request weighing half. A request's opening is
    the draft's weakest guess, so a server asked the same kind of thing again (an agent's
    loop, a chat, a benchmark) should draft again a few steps later; but a probe after g
    skipped tokens costs their catch-up (about 3 ms each on a 135M Q4_1 draft), and one
    right guess saves at most that: only runs pay. Kept per tenant (API key), as recall is:
    one team member's text must not set another's decode speed."""

    def __init__(self) -> None:
        self._seen: OrderedDict[str | None, tuple[float | None, Tally]] = OrderedDict()

    def start(self, tenant: str | None) -> tuple[float | None, Tally]:
        """The tenant's share of tokens in runs (None: nothing known) and the new request's
        tally; the request before it is folded in now (it has ended, or is far along)."""
        prior, last = self._seen.pop(tenant, (None, None))
        if last is not None and last.written:
            now = last.runs / last.written
            prior = now if prior is None else (prior + now) / 2
        tally = Tally()
        self._seen[tenant] = (prior, tally)
        if len(self._seen) > TENANTS:
            self._seen.popitem(last=False)
        return prior, tally


class DraftContext:
    """A loaded draft model and its context, shared by every sequence of one target context."""

    def __init__(self, model, ctx, limits: DraftLimits, cost: float, name: str) -> None:
        self.model, self.ctx, self.limits, self.name = model, ctx, limits, name
        self.costs = StepCosts(cost)  # a draft token's decode and a verified row, in target decodes
        self._sequences: dict[int, Sequence] = {}
        self.priors = TenantPriors()

    def sequence(self, seq_id: int) -> Sequence:
        """The draft's cells for a target sequence id; kept between requests (prefix reuse)."""
        return self._sequences.setdefault(seq_id, Sequence(self.ctx, seq_id))

    def drafter(self, seq_id: int, prompt: list[int], tenant: str | None = None) -> ModelDrafter:
        return ModelDrafter(self, seq_id, prompt, tenant)

    def close(self) -> None:
        self.ctx.close()
        self.model.close()

    def draft(self, wanted: list[tuple[ModelDrafter, int]]) -> list[list[int]]:
        """Drafts for several sequences, each up to its length, evaluated in shared batches;
        the calls are timed for the length rule (runtime/drafting/draft_costs.py)."""
        todo = [(d, n) for d, n in wanted if n > 0]
        out: dict[int, list[int]] = {id(d): [] for d, _ in wanted}
        if not todo:
            return [[] for _ in wanted]
        began = time.perf_counter()
        rows, evaluated = self._catch_up([d for d, _ in todo])
        caught_up = time.perf_counter()
        if evaluated <= 2 * len(todo):  # a drafting step's, not a new prompt's or a probe's window
            self.costs.catch_up(len(todo), (caught_up - began) * 1000)
        self._extend(todo, rows, out)
        self.costs.drafting((time.perf_counter() - began) * 1000)
        for d, n in todo:
            if not out[id(d)]:
                d.outcome(0, n)  # declined (under p_min): the catch-up was paid for, and nothing was guessed
        return [out[id(d)] for d, _ in wanted]

    def _extend(self, todo: list[tuple[ModelDrafter, int]], rows: dict[int, int], out: dict[int, list[int]]) -> None:
        """Draft greedily from each sequence's logit row until its length or p_min, one shared
        call per further token."""
        n_vocab = self.model.n_vocab
        while todo:
            entries: list[tuple[int, int, int, bool]] = []
            nxt: dict[int, int] = {}
            left: list[tuple[ModelDrafter, int]] = []
            for d, n in todo:
                token, p = _top(self.ctx.logit_row(rows[id(d)], n_vocab))
                if p < self.limits.p_min and not d.probing:  # a probe's guess is verified however unsure
                    continue
                d.sure = p >= self.limits.p_min
                out[id(d)].append(token)
                if len(out[id(d)]) >= n:
                    continue  # the last draft token is evaluated with the next catch-up, if it is kept
                nxt[id(d)] = len(entries)
                entries.append((token, d.seq.next_pos, d.seq.seq, True))
                d.seq.kv.append(token)
                left.append((d, n))
            if entries:
                began = time.perf_counter()
                self.ctx.decode_batch(entries)
                self.costs.draft_token(len(entries), (time.perf_counter() - began) * 1000)
            rows, todo = nxt, left

    def _catch_up(self, drafters: list[ModelDrafter]) -> tuple[dict[int, int], int]:
        """Evaluate what each sequence's cells lack of its history; returns the batch row of
        each one's last token, whose logits give its first draft token, and how many tokens
        it evaluated. Logits live only until the next decode, so every sequence's last token
        goes into the final call."""
        body: list[tuple[int, int, int, bool]] = []
        last: list[tuple[int, int, int, bool]] = []
        for d in drafters:
            held = d.unseen()
            keep = min(common_prefix(d.seq.kv, held), len(held) - 1)  # the last token's logits are needed
            d.seq.keep(keep)
            for i, t in enumerate(held[keep:]):
                (last if keep + i == len(held) - 1 else body).append((t, d.seq.next_pos, d.seq.seq, False))
                d.seq.kv.append(t)
        if len(body) + len(last) <= self.ctx.n_batch:
            body, last = [], body + last
        for at in range(0, len(body), self.ctx.n_batch):
            self.ctx.decode_batch(body[at:at + self.ctx.n_batch])
        rows: dict[int, int] = {}
        entries: list[tuple[int, int, int, bool]] = []
        ends = {(d.seq.seq, d.seq.next_pos - 1): d for d in drafters}
        for t, pos, seq, _ in last:
            end = ends.get((seq, pos))
            if end is not None:
                rows[id(end)] = len(entries)
            entries.append((t, pos, seq, end is not None))
        self.ctx.decode_batch(entries)
        return rows, len(body) + len(entries)


def propose_all(wanted: list[tuple[object, int]], drafts: DraftContext | None, busy: int = 1) -> list[list[int]]:
    """A step's drafts for several sequences, (drafter, room) each, `busy` sequences
    decoding in the step: lookup drafters propose alone, the draft model's drafters in
    shared batches, each as long as pays with that many sharing the step."""
    out: list[list[int]] = [[] for _ in wanted]
    batched = []
    for i, (drafter, room) in enumerate(wanted):
        if isinstance(drafter, ModelDrafter):
            batched.append((i, drafter, drafter.length(room, busy)))
        else:
            out[i] = drafter.propose(room)  # type: ignore[attr-defined]
    if batched:
        assert drafts is not None  # a ModelDrafter comes from the engine's draft model
        for (i, _, _), d in zip(batched, drafts.draft([(drafter, k) for _, drafter, k in batched])):
            out[i] = d
    return out


def _top(logits) -> tuple[int, float]:
    """The most likely token and its probability."""
    import numpy as np

    token = int(np.argmax(logits))
    shifted = np.exp(logits - logits[token])
    return token, float(1.0 / shifted.sum())


class ModelDrafter:
    """One sequence's drafts from the draft model, with the interface of LookupDrafter. Its
    draft cells hold history[start:]: from the start, or, after a probe, a short window."""

    def __init__(self, owner: DraftContext, seq_id: int, prompt: list[int], tenant: str | None = None) -> None:
        self.owner = owner
        self.seq = owner.sequence(seq_id)
        self.history = list(prompt)
        self.start = 0  # the history index the draft's cell 0 holds
        self.prior, self.tally = owner.priors.start(tenant)  # the tenant's earlier requests (TenantPriors)
        # steps after a wrong guess before the next probe (TenantPriors says why)
        self.patience = PROBE_EVERY if self.prior is None else max(1, round(PROBE_EVERY * (1 - 2 * self.prior)))
        # the request's first step probes (a window of the prompt), unless the tenant's drafts
        # seldom paid (under SELDOM of its tokens came in runs): then it waits its patience,
        # expecting nothing, and a probe then can still find predictable text
        self.first = self.prior is None or self.prior > SELDOM
        self.acceptance = FIRST_ACCEPTANCE if self.first else 0.0
        self.idle = 0  # steps since the last draft
        self.probe_every = 1 if self.first else self.patience  # then `patience`, four times longer while probes find nothing
        self.window = False  # the next catch-up evaluates only the last PROBE_WINDOW tokens
        self.probing = False  # this step's draft is a probe: one token, proposed whatever p_min says
        self.sure = True  # the draft's last guess was over p_min

    def extend(self, tokens) -> None:
        before = len(self.history)
        self.history.extend(tokens)
        self.tally.written += len(self.history) - before

    def length(self, room: int, busy: int = 1) -> int:
        """This step's draft length, from the acceptance seen so far and how many sequences
        share the step."""
        limits = self.owner.limits
        top = min(limits.max, room)
        self.probing = False
        k = max(self._best(self.acceptance, top, busy), min(limits.min, top))
        reach = self.owner.costs.reach(busy)
        if busy == 1 and self.acceptance >= EXPLORE_AT and reach < top:
            # Longer drafts' rows have not been timed: drafts that are this often right
            # double their reach until they have (1, 3, 7, 15 ...), then the times decide.
            k = max(k, min(top, 2 * max(reach, 1) + 1))
        first, self.first = self.first, False
        if k == 0 or first and not limits.min:  # a first draft is a probe: the prompt caught up on from a window
            self.idle += 1
            if self.idle < self.probe_every or top < 1 or not self._worth_looking(top, busy):
                return 0
            # A probe: one token, from a short window of the latest text rather than all that
            # the draft missed; rarer each time it finds nothing (outcome undoes the backoff
            # when it finds something).
            k, self.probing = 1, True
            if self.probe_every >= self.patience:
                self.probe_every = min(4 * self.probe_every, PROBE_MOST)
            # what the cells hold may be another request's (a window of it): only their common
            # prefix with this history is kept, so that is what the gap is measured from
            seen = common_prefix(self.seq.kv, self.history[self.start:])
            self.window = len(self.history) - self.start - seen > PROBE_WINDOW
        self.idle = 0
        return k

    def _best(self, acceptance: float, top: int, busy: int) -> int:
        costs = self.owner.costs
        first, rest = costs.draft(busy)
        return best_length(acceptance, rest, top, busy, lambda k: costs.rows(busy, k), first)

    def _worth_looking(self, top: int, busy: int) -> bool:
        """Whether a draft that is always right could pay: unknown until everything it costs
        has been timed (a probe of one that could not is cost with nothing to find out)."""
        return not self.owner.costs.measured(busy, top) or self._best(ALWAYS_RIGHT, top, busy) > 0

    def observe_step(self, sequences: int, rows: int, ms: float) -> None:
        """A target decode call that verified (or could have verified) drafts: its cost."""
        self.owner.costs.target_step(sequences, rows, ms)

    def observe_whole(self, sequences: int, call_ms: float, wall_ms: float) -> None:
        """A whole step, from its drafts to its sampling, whose target call took `call_ms`."""
        self.owner.costs.whole_step(sequences, call_ms, wall_ms)

    def unseen(self) -> list[int]:
        """The history the draft's cells should hold (a window, when a probe asked for one)."""
        if self.window:
            self.window = False
            self.seq.clear()
            self.start = max(0, len(self.history) - PROBE_WINDOW)
        return self.history[self.start:]

    def propose(self, room: int) -> list[int]:
        k = self.length(room)
        return self.owner.draft([(self, k)])[0] if k else []

    def outcome(self, accepted: int, proposed: int) -> None:
        """`accepted` of a draft of `proposed` tokens were confirmed (0 of n: the draft model
        declined all n it was asked for)."""
        if proposed:
            step = accepted / proposed
            self.acceptance += SMOOTHING * (step - self.acceptance)
            self.tally.runs += max(0, accepted - 1)
            # Right: while a long draft that is always right could pay, look again at the
            # next step, so that a run of right guesses raises the estimate to where drafting
            # pays within a few tokens, not a few probes of 32. Wrong: every `patience`
            # steps, four times longer after each.
            if accepted and self.sure:  # a lucky guess the draft was unsure of counts as a miss here
                self.probe_every = 1 if self._worth_looking(self.owner.limits.max, 1) else self.patience
            elif self.probe_every < self.patience:
                self.probe_every = self.patience

"""Drafts from what a model read and wrote for earlier requests (docs/DESIGN.md, "Recall
drafts").

Agents and tool loops ask a fresh context for what an earlier one produced: the same
boilerplate, the same tool call, the same plan. A prompt lookup cannot see it, since it is
in no prompt. So each model keeps a memory of recent requests' tokens (what each evaluated
of its prompt, and what it wrote), indexed by the 4-grams in it, and a lookup drafter that
finds nothing in its own request asks the memory what followed the same four tokens last
time.

The memory is bounded (a number of tokens per scope, the oldest request's forgotten first)
and scoped: one per API key (tenant), never shared between them, so one team member's text
cannot be read from another's decode timing. Its index may hold entries of forgotten
requests; they are misses when looked up, and the index is rebuilt from what is still
remembered when they could outnumber the live ones.
"""

from __future__ import annotations

from collections import OrderedDict

NGRAM = 4  # tokens of context a recalled draft must match: more than a prompt lookup asks, the memory being larger
BUDGET = 32768  # tokens remembered per scope (~10 MB of index)
SCOPES = 8  # scopes (tenants) remembered per model; the least recently used is forgotten
_BITS = 24  # a token id fits in 24 bits (vocabularies are under 16.7 million)


def _key(tokens: list[int]) -> int:
    """The last NGRAM tokens packed into one int: a smaller dict key than a tuple."""
    key = 0
    for t in tokens[-NGRAM:]:
        key = (key << _BITS) | (t & ((1 << _BITS) - 1))
    return key


class Memory:
    """One scope's remembered requests: their tokens, and where each 4-gram last led."""

    def __init__(self, budget: int = BUDGET) -> None:
        self.budget = budget
        self.docs: OrderedDict[int, list[int]] = OrderedDict()  # a request's serial -> its tokens, oldest first
        self.index: dict[int, tuple[int, int]] = {}  # 4-gram -> (serial, where its continuation starts)
        self.size = 0  # tokens in docs
        self.serial = 0

    def open(self) -> int:
        """A new request's record; its serial for `append`."""
        self.serial += 1
        self.docs[self.serial] = []
        return self.serial

    def append(self, serial: int, tokens) -> None:
        """More of a request's tokens; nothing once its record has been forgotten."""
        toks = self.docs.get(serial)
        if toks is None:
            return
        for token in tokens:
            if len(toks) >= self.budget:
                break  # a request longer than the whole memory: its beginning is what is kept
            if len(toks) >= NGRAM:
                self.index[_key(toks)] = (serial, len(toks))
            toks.append(token)
            self.size += 1
        self._forget(serial)

    def _forget(self, keep: int) -> None:
        while self.size > self.budget and len(self.docs) > 1:
            oldest = next(iter(self.docs))
            if oldest == keep:  # the request being written goes last
                self.docs.move_to_end(keep)
                continue
            self.size -= len(self.docs.pop(oldest))
        if len(self.index) > 2 * self.budget:
            self._reindex()

    def _reindex(self) -> None:
        self.index = {}
        for serial, toks in self.docs.items():
            for at in range(NGRAM, len(toks)):
                self.index[_key(toks[at - NGRAM:at])] = (serial, at)

    def continuation(self, context: list[int], limit: int) -> list[int]:
        """What followed the last NGRAM tokens of `context` the last time a remembered request
        had them."""
        if len(context) < NGRAM or limit <= 0:
            return []
        hit = self.index.get(_key(context))
        if hit is None:
            return []
        toks = self.docs.get(hit[0])
        return [] if toks is None else toks[hit[1]:hit[1] + limit]


class Recall:
    """A model's memories, one per scope (the tenant: an API key's name, or None)."""

    def __init__(self, budget: int = BUDGET, scopes: int = SCOPES) -> None:
        self.budget, self.scopes = budget, scopes
        self.memories: OrderedDict[str | None, Memory] = OrderedDict()

    def memory(self, scope: str | None) -> Memory | None:
        """The scope's memory (made on first use); None when recall is off (a budget of 0)."""
        if self.budget <= 0:
            return None
        found = self.memories.get(scope)
        if found is None:
            found = self.memories[scope] = Memory(self.budget)
            while len(self.memories) > self.scopes:
                self.memories.popitem(last=False)
        self.memories.move_to_end(scope)
        return found

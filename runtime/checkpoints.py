"""State checkpoints for a cache that cannot be cut back (docs/DESIGN.md, "Recurrent state").

A recurrent layer (Mamba, RWKV, and the hybrids that mix them with attention: LFM2, Granite
4 H, Qwen3-Next) keeps one state per sequence, the sum of every token it has read, so
llama.cpp cannot drop the cells after a prefix. A Sequence of such a model keeps copies of
that state at a few prefix lengths (where a turn begins, the prompt but its last token);
cutting back restores the longest copy that fits, and the prefill evaluates the rest.
"""

from __future__ import annotations

from collections import OrderedDict

LIMIT = 8  # copies per sequence (llama-server keeps 8 too)


class Checkpoints:
    """A sequence's saved states by the number of tokens each follows."""

    def __init__(self, limit: int = LIMIT) -> None:
        self.limit = limit
        self._held: OrderedDict[int, bytes] = OrderedDict()  # in order of use, the last used last

    def add(self, n: int, state: bytes) -> None:
        self._held[n] = state
        self._held.move_to_end(n)
        while len(self._held) > self.limit:
            del self._held[self._thinnest()]

    def _thinnest(self) -> int:
        """The checkpoint to forget when there are too many: of all but the two used last (the
        turn in progress: a regenerated answer, an edited last message), the one whose
        neighbours are closest, so that those left stay spread over the whole conversation
        and an edit anywhere re-evaluates about as much."""
        recent = list(self._held)[-2:]
        held = sorted(self._held)
        ends = [0, *held, held[-1]]  # the last one's gap ends at itself
        gaps = {k: ends[i + 2] - ends[i] for i, k in enumerate(held) if k not in recent}
        return min(gaps, key=lambda k: (gaps[k], k))

    def longest(self, n: int) -> int:
        """The length of the longest saved state that follows at most `n` tokens (0: none)."""
        return max((k for k in self._held if k <= n), default=0)

    def best(self, n: int) -> tuple[int, bytes] | None:
        """The longest saved state that follows at most `n` tokens (marked as used)."""
        k = self.longest(n)
        if not k:
            return None
        self._held.move_to_end(k)
        return k, self._held[k]

    def drop_after(self, n: int) -> None:
        """Forget the states that follow more than `n` tokens: those cells are gone, and what
        comes next may differ."""
        for k in [k for k in self._held if k > n]:
            del self._held[k]

    def clear(self) -> None:
        self._held.clear()

    def copy(self) -> Checkpoints:
        twin = Checkpoints(self.limit)
        twin._held = OrderedDict(self._held)  # the states are immutable bytes: shared
        return twin

    def lengths(self) -> list[int]:
        return sorted(self._held)

    def nbytes(self) -> int:
        return sum(len(s) for s in self._held.values())

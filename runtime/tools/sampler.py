"""`TriggeredSampler`: a sampler whose tool-call grammar starts when the answer opens a call."""

from __future__ import annotations

from typing import Any, Callable

from tallow.runtime.tools.constrain import LazyGrammar


class TriggeredSampler:
    """A sampler whose grammar starts when the answer opens a call. It watches the text of the
    tokens it samples; once a call opens at a token boundary, it swaps in a sampler with the
    grammar of the rest of the call. An opening split inside a token never triggers (the
    answer is then parsed as written), so llama.cpp never sees text its grammar refuses."""

    def __init__(self, make: Callable[[str | None], Any], piece: Callable[[int], bytes], lazy: LazyGrammar) -> None:
        self.make, self.piece, self.lazy = make, piece, lazy
        self.inner = make(None)
        self.text = b""
        self.watching = True

    def accept(self, token: int) -> None:
        self.inner.accept(token)

    def sample(self, ctx, idx: int = -1) -> int:
        token = self.inner.sample(ctx, idx)
        if self.watching:
            self.text += self.piece(token)
            consumed = self._opened()
            if consumed is not None:
                self.watching = False
                old, self.inner = self.inner, self.make(self.lazy.grammar.after(consumed))
                old.close()
        return token

    def _opened(self) -> str | None:
        """What of the call's opening follows the marker, if a call opened; else None."""
        lazy, opening = self.lazy, self.lazy.grammar.opening.encode()
        text = self.text
        if lazy.reasoning:
            start, end = (m.encode() for m in lazy.reasoning)
            if text.count(start) > text.count(end):
                return None
        if not lazy.marker:  # the answer itself is the call
            body = text.lstrip()
            if len(body) > len(opening):
                self.watching = False
                return None
            return body.decode() if body and opening.startswith(body) else None
        marker = lazy.marker.encode()
        at = text.rfind(marker, max(0, len(text) - len(marker) - len(opening) - 8))
        if at < 0:
            return None
        after = text[at + len(marker):].lstrip()
        return after.decode() if opening.startswith(after) else None

    def close(self) -> None:
        self.inner.close()

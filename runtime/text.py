"""Incremental detokenization and stop-string matching.

Both run once per token in the decode loop, so each does O(piece) work, never
O(output): the high-level llama_cpp API re-detokenizes the whole completion at
every token, which is quadratic.
"""

from __future__ import annotations

import codecs


class Detokenizer:
    """Turns token pieces (bytes of any length) into text as soon as it is complete UTF-8.

    A character split across tokens is held until its last byte arrives; invalid
    bytes become U+FFFD, as a whole-sequence decode with errors='replace' would.
    """

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, piece: bytes) -> str:
        return self._decoder.decode(piece)

    def flush(self) -> str:
        return self._decoder.decode(b"", final=True)


class StopMatcher:
    """Finds the first stop string to complete in streamed text; holds back only what may start one.

    `push` returns (text safe to emit, stopped). Text after a stop string is dropped,
    and nothing of the stop string itself is ever emitted.
    """

    def __init__(self, stops: list[str]) -> None:
        self.stops = [s for s in stops if s]
        self._held = ""
        self._max = max((len(s) for s in self.stops), default=0)

    def push(self, text: str) -> tuple[str, bool]:
        if not self.stops:
            return text, False
        buf = self._held + text
        # A stop string can only end inside the new text, so search from where it could start.
        start = max(0, len(self._held) - self._max + 1)
        # The stop that completes first wins (a stream cannot wait to see whether a longer,
        # earlier-starting one would complete later); on a tie, the one starting earlier.
        best: tuple[int, int] | None = None
        for s in self.stops:
            i = buf.find(s, start)
            if i != -1 and (best is None or (i + len(s), i) < best):
                best = (i + len(s), i)
        if best is not None:
            self._held = ""
            return buf[: best[1]], True
        keep = self._partial_suffix(buf)
        self._held = buf[len(buf) - keep:] if keep else ""
        return buf[: len(buf) - keep], False

    def _partial_suffix(self, buf: str) -> int:
        """Length of the longest suffix of buf that is a proper prefix of some stop string."""
        longest = 0
        for s in self.stops:
            for k in range(min(len(s) - 1, len(buf)), longest, -1):
                if buf.endswith(s[:k]):
                    longest = k
                    break
        return longest

    def flush(self) -> str:
        held, self._held = self._held, ""
        return held

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
    bytes become U+FFFD, as a whole-sequence decode with errors='replace' would. The
    bytes of a character still unfinished when the answer ends (cut by max_tokens or a
    stop) are dropped, not turned into U+FFFD: `dropped` counts them.
    """

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.dropped = 0

    def push(self, piece: bytes) -> str:
        return self._decoder.decode(piece)

    def flush(self) -> str:
        held = self._decoder.getstate()[0]
        if held and _cut_character(held):
            self.dropped += len(held)
            self._decoder.reset()
            return ""
        # What it holds could never have become a character (CPython holds some invalid
        # pairs, such as a surrogate's b"\xed\xa0", until the end): replaced, as a whole decode would.
        return self._decoder.decode(b"", final=True)


# The second byte a lead byte allows (RFC 3629); the others are 0x80-0xBF.
_SECOND = {0xE0: (0xA0, 0xBF), 0xED: (0x80, 0x9F), 0xF0: (0x90, 0xBF), 0xF4: (0x80, 0x8F)}


def _cut_character(held: bytes) -> bool:
    """True when `held` is the start of a valid UTF-8 character that lacks its last bytes."""
    lead = held[0]
    size = 2 if 0xC2 <= lead <= 0xDF else 3 if 0xE0 <= lead <= 0xEF else 4 if 0xF0 <= lead <= 0xF4 else 0
    if not size or len(held) >= size:
        return False
    for i, b in enumerate(held[1:], 1):
        lo, hi = _SECOND.get(lead, (0x80, 0xBF)) if i == 1 else (0x80, 0xBF)
        if not lo <= b <= hi:
            return False
    return True


class StopMatcher:
    """Finds the first stop string to complete in streamed text; holds back only what may start one.

    `push` returns (text safe to emit, stopped). Text after a stop string is dropped,
    and nothing of the stop string itself is ever emitted.
    """

    def __init__(self, stops: list[str]) -> None:
        self.stops = [s for s in stops if s]
        self.matched: str | None = None  # the stop string that ended the text
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
            self.matched = buf[best[1]:best[0]]
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


class ReasoningSplitter:
    """Separates a model's private reasoning (between markers such as <think>...</think>)
    from its answer, in streamed text. A possible partial marker is held back."""

    def __init__(self, open_tag: str, close_tag: str, inside: bool = False) -> None:
        self.open_tag, self.close_tag = open_tag, close_tag
        self.inside = inside
        self._held = ""

    def push(self, text: str) -> tuple[str, str, bool]:
        """Returns (answer text, reasoning text, whether this text touched reasoning)."""
        buf = self._held + text
        self._held = ""
        answer: list[str] = []
        reasoning: list[str] = []
        touched = self.inside
        while buf:
            tag = self.close_tag if self.inside else self.open_tag
            i = buf.find(tag)
            if i == -1:
                keep = _prefix_overlap(buf, tag)
                body, self._held = buf[: len(buf) - keep], buf[len(buf) - keep:]
                (reasoning if self.inside else answer).append(body)
                break
            (reasoning if self.inside else answer).append(buf[:i])
            buf = buf[i + len(tag):]
            self.inside = not self.inside
            touched = True
        return "".join(answer), "".join(reasoning), touched

    def flush(self) -> tuple[str, str]:
        held, self._held = self._held, ""
        return ("", held) if self.inside else (held, "")


def _prefix_overlap(buf: str, tag: str) -> int:
    for k in range(min(len(tag) - 1, len(buf)), 0, -1):
        if buf.endswith(tag[:k]):
            return k
    return 0


def reasoning_markers(template: str | None) -> tuple[str, str] | None:
    """The reasoning markers a chat template declares, if any."""
    if template and "<think>" in template and "</think>" in template:
        return ("<think>", "</think>")
    return None


def opens_reasoning(prompt_text: str, markers: tuple[str, str] | None) -> bool:
    """True when the rendered prompt leaves a reasoning block open for the model to fill."""
    if not markers:
        return False
    return prompt_text.rfind(markers[0]) > prompt_text.rfind(markers[1])

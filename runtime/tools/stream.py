"""Tool calls read out of a model's answer, whole or as it streams, for every family.

One scanner serves both: `scan(text, fmt)` reads the answer so far and says what is certain
in it (content that can no longer turn into a call, each call's name and the part of its
arguments written so far). Streaming diffs the scans of successive prefixes (`CallStream`),
the whole answer is the scan of all of it with `final=True`, so a streamed answer assembles
to exactly the whole one."""

from __future__ import annotations

from dataclasses import dataclass

from tallow.runtime.tools.formats import family
from tallow.runtime.tools.parse import Scan


def scan(text: str, fmt: str, final: bool = False) -> Scan:
    """What is certain in an answer so far (or, with final, all of it)."""
    return family(fmt).scan(text, final)


@dataclass
class Delta:
    """One step of a streamed answer: content (or reasoning), or a call's start (index, name,
    id) or a fragment of its arguments."""

    kind: str  # content | reasoning | call | arguments
    text: str = ""
    index: int = 0
    id: str = ""  # a call's id (given by the server)


class CallStream:
    """Turns an answer's text, as it streams, into content and tool-call deltas."""

    def __init__(self, fmt: str) -> None:
        self.fmt = fmt
        self.text = ""
        self.sent = ""  # content sent so far
        self.sent_args: list[int] = []  # per call: characters of arguments sent

    def feed(self, piece: str) -> list[Delta]:
        self.text += piece
        return self._diff(scan(self.text, self.fmt))

    def finish(self) -> tuple[list[Delta], Scan]:
        """The last deltas and the whole answer's scan. When the whole answer turns out not to
        be a call after a call was streamed (cut off), the rest of the text follows as content."""
        whole = scan(self.text, self.fmt, final=True)
        return self._diff(whole), whole

    def _diff(self, now: Scan) -> list[Delta]:
        out: list[Delta] = []
        # Content only grows; should the whole answer read differently from its prefixes (a
        # call cut off, sent as content after all), what was not sent yet follows.
        if len(now.content) > len(self.sent) and now.content.startswith(self.sent):
            out.append(Delta("content", now.content[len(self.sent):]))
            self.sent = now.content
        if now.error is not None:
            return out
        for n, call in enumerate(now.calls):
            if n >= len(self.sent_args):
                out.append(Delta("call", call.name, n))
                self.sent_args.append(0)
            if len(call.arguments) > self.sent_args[n]:
                out.append(Delta("arguments", call.arguments[self.sent_args[n]:], n))
                self.sent_args[n] = len(call.arguments)
        return out

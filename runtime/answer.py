"""An answer as every API shapes it: reasoning, content and tool calls, streamed or whole.

The engine's events carry text; with tools offered, `Answer` reads calls out of it
(runtime/tools/stream.py) and gives each route the same deltas and the same end: content,
calls with their ids, reasoning, why a call did not parse, and the finish reason.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field

from tallow.runtime.tools.choice import ToolChoice
from tallow.runtime.tools.stream import CallStream, Delta, scan
from tallow.runtime.types import FinalEvent, TokenEvent


def call_id() -> str:
    return "call_" + secrets.token_hex(12)


@dataclass
class Outcome:
    content: str
    reasoning: str
    calls: list[tuple[str, str, str]] = field(default_factory=list)  # (id, name, arguments JSON)
    error: str | None = None  # tallow's extension: why text that looked like a call is content
    finish_reason: str = "stop"  # tool_calls when the answer is calls


class Answer:
    def __init__(self, choice: ToolChoice | None) -> None:
        on = choice is not None and choice.mode != "none" and bool(choice.offered)
        self.fmt = choice.format if choice is not None and on else None
        offered = choice.offered if choice is not None and on else []
        self.names = {t.name for t in offered}
        self.schemas = {t.name: t.parameters for t in offered}
        self.calls = CallStream(self.fmt) if self.fmt is not None else None
        self.ids: list[str] = []
        self.sent = ""  # content sent
        self.failed: str | None = None  # a streamed call named no offered tool: the rest is content

    def feed(self, ev: TokenEvent) -> list[Delta]:
        out = [Delta("reasoning", ev.reasoning)] if ev.reasoning else []
        return out + self._text(ev.text)

    def _text(self, text: str) -> list[Delta]:
        if not text:
            return []
        if self.calls is None or self.failed:
            if self.calls is not None:
                self.calls.text += text
                return []  # released at the end
            self.sent += text
            return [Delta("content", text)]
        return self._checked(self.calls.feed(text))

    def _checked(self, deltas: list[Delta]) -> list[Delta]:
        out = []
        for d in deltas:
            if d.kind == "call" and d.text not in self.names:
                self.failed = f"the answer calls '{d.text}', which is not among the tools"
                break
            if d.kind == "call":
                self.ids.append(call_id())
                d = Delta("call", d.text, d.index, self.ids[d.index])
            elif d.kind == "content":
                self.sent += d.text
            out.append(d)
        return out

    def _invalid(self, calls) -> str | None:
        """Why a call's arguments break its tool's schema (the grammar enforces most of a
        schema; what it cannot, such as wide numeric bounds, is checked here)."""
        import json

        from jsonschema import ValidationError, validate

        for c in calls:
            try:
                validate(json.loads(c.arguments), self.schemas[c.name])
            except ValidationError as exc:
                return f"the arguments of '{c.name}' do not follow its schema: {exc.message}"
        return None

    def finish(self, final: FinalEvent) -> tuple[list[Delta], Outcome]:
        """The last deltas (held-back text, the rest of a call) and the whole answer."""
        deltas = ([Delta("reasoning", final.reasoning_tail)] if final.reasoning_tail else [])
        if self.calls is None:
            deltas += self._text(final.tail)
            return deltas, Outcome(final.text, final.reasoning, finish_reason=final.finish_reason)
        if not self.failed:
            deltas += self._checked(self.calls.feed(final.tail))
        else:
            self.calls.text += final.tail
        if not self.failed:
            last, whole = self.calls.finish()
            if whole.cut and final.finish_reason == "length":  # cut inside a call: the raw text is no answer
                return deltas, self._cut(whole, final)
            deltas += self._checked(last)
            unknown = [c.name for c in whole.calls if c.name not in self.names]
            invalid = None if whole.error or unknown else self._invalid(whole.calls)
            if whole.error is None and not unknown and invalid is None:
                calls = [(self.ids[i] if i < len(self.ids) else call_id(), c.name, c.arguments)
                         for i, c in enumerate(whole.calls)]
                reason = "tool_calls" if calls else final.finish_reason
                return deltas, Outcome(whole.content, final.reasoning, calls, None, reason)
            self.failed = whole.error or invalid or f"the answer calls '{unknown[0]}', which is not among the tools"
        text = self.calls.text
        rest = text[len(self.sent):] if text.startswith(self.sent) else text
        if rest:
            deltas.append(Delta("content", rest))
        return deltas, Outcome(text, final.reasoning, [], self.failed, final.finish_reason)

    def _cut(self, got, final: FinalEvent) -> Outcome:
        """An answer max_tokens cut inside a call: the calls completed before the cut, as calls
        (the one cut off is dropped, and `error` says so), the finish reason still length."""
        done = [c for c in got.before_cut if c.name in self.names]
        ids = self.ids + [call_id() for _ in range(len(done) - len(self.ids))]
        calls = [(ids[i], c.name, c.arguments) for i, c in enumerate(done)]
        return Outcome("", final.reasoning, calls, got.error + " by max_tokens", "length")

    def whole(self, final: FinalEvent) -> Outcome:
        """The outcome of an answer that was not streamed."""
        if self.calls is None:
            return Outcome(final.text, final.reasoning, finish_reason=final.finish_reason)
        assert self.fmt is not None  # calls are read only where a format is
        got = scan(final.text, self.fmt, final=True)
        if got.cut and final.finish_reason == "length":
            return self._cut(got, final)
        unknown = [c.name for c in got.calls if c.name not in self.names]
        invalid = None if got.error or unknown else self._invalid(got.calls)
        if got.error is not None or unknown or invalid:
            error = got.error or invalid or f"the answer calls '{unknown[0]}', which is not among the tools"
            return Outcome(final.text, final.reasoning, [], error, final.finish_reason)
        calls = [(call_id(), c.name, c.arguments) for c in got.calls]
        return Outcome(got.content, final.reasoning, calls, None, "tool_calls" if calls else final.finish_reason)

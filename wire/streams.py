"""One adapter per API between the engine's events and the API's answer: the server drives
them all the same way (`opening`, `tokens`, `closing` for a stream, `whole` for a whole
answer), and each says its answer in its own shape (wire/openai_api.py,
wire/responses_api.py, wire/anthropic_api.py, wire/ollama_api.py)."""

from __future__ import annotations

import json
from typing import Any

from tallow.runtime.answer import Answer, Outcome
from tallow.runtime.intake import Parsed
from tallow.runtime.logprobs import token_logprob
from tallow.runtime.scheduling.forks import merged
from tallow.runtime.types import FinalEvent, TokenEvent
from tallow.wire import anthropic_api, ollama_api, openai_api, responses_api


def _data(obj: dict[str, Any]) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


class ChatAdapter:
    """Chat and text completions: `data:` chunks, then `data: [DONE]`."""


    def __init__(self, parsed: Parsed, model: str, piece, fingerprint: str) -> None:
        self.parsed = parsed
        self.shaper = openai_api.Shaper(parsed, model, piece, fingerprint)
        self.answer = Answer(parsed.tools)

    def opening(self, prompt_tokens: int) -> list[str]:
        if self.shaper.echo:  # a text completion's `echo`: the prompt first
            return [_data(self.shaper.chunk(self.shaper.echo))]
        return [_data(self.shaper.chunk(first=True))] if self.shaper.chat else []

    def tokens(self, ev: TokenEvent) -> list[str]:
        entry = self.shaper.note(ev)
        if not self.shaper.chat:
            return [_data(self.shaper.chunk(ev.text, entry=entry))] if ev.text or entry is not None else []
        return [_data(c) for c in self.shaper.deltas(self.answer.feed(ev), entry)]

    def closing(self, final: FinalEvent) -> list[str]:
        return self.finished(final) + self.ending(final)

    def ending(self, usage: FinalEvent) -> list[str]:
        """The usage chunk (when asked for; of n choices, their merged usage), then [DONE]."""
        out = [_data(self.shaper.usage_chunk(usage))] if self.parsed.include_usage else []
        return out + ["data: [DONE]\n\n"]

    def finished(self, final: FinalEvent) -> list[str]:
        """The choice's last chunks: what was held back, and its finish reason."""
        deltas, outcome = self.answer.finish(final)
        if not self.shaper.chat:
            out = [_data(self.shaper.chunk(final.tail))] if final.tail else []
            out.append(_data(self.shaper.chunk(finish=final.finish_reason)))
            return out
        out = [_data(c) for c in self.shaper.deltas(deltas)]
        out.append(_data(self.shaper.chunk(finish=outcome.finish_reason, error=outcome.error)))
        return out

    def failed(self, message: str) -> list[str]:
        return [_data(openai_api.APIError(message, 500, kind="server_error").body())]

    def note(self, ev: TokenEvent) -> None:
        self.shaper.note(ev)

    def whole(self, final: FinalEvent) -> dict[str, Any]:
        return self.shaper.whole(final, self.answer.whole(final))


def choices_of(adapters: list[ChatAdapter], finals: list[FinalEvent]) -> dict[str, Any]:
    """n choices' whole answer: one object, a choice per fork, the usage merged."""
    bodies = [a.whole(f) for a, f in zip(adapters, finals)]
    out = bodies[0]
    out["choices"] = [b["choices"][0] for b in bodies]
    out["usage"] = openai_api.usage(merged(finals))
    return out


def choice_adapters(parsed: Parsed, model: str, piece, fingerprint: str) -> list[ChatAdapter]:
    """An adapter per choice (parsed.n of them), writing one answer's id, each its index."""
    out = [ChatAdapter(parsed, model, piece, fingerprint) for _ in range(parsed.n)]
    for i, a in enumerate(out):
        a.shaper.index, a.shaper.id, a.shaper.created = i, out[0].shaper.id, out[0].shaper.created
    return out


class ResponsesAdapter:

    def __init__(self, parsed: Parsed, model: str) -> None:
        self.parsed = parsed
        self.shaper = responses_api.Shaper(parsed, model)
        self.answer = Answer(parsed.tools)
        self.result: dict[str, Any] | None = None  # the response object, once complete

    def opening(self, prompt_tokens: int) -> list[str]:
        return self.shaper.start()

    def tokens(self, ev: TokenEvent) -> list[str]:
        return self.shaper.deltas(self.answer.feed(ev))

    def closing(self, final: FinalEvent) -> list[str]:
        deltas, outcome = self.answer.finish(final)
        out = self.shaper.deltas(deltas) + self.shaper.end(final, outcome)
        self.result = self.shaper.response(self.shaper.status_of(final), self.shaper.items, final, outcome.error)
        return out

    def failed(self, message: str) -> list[str]:
        return self.shaper.failed(message)

    def note(self, ev: TokenEvent) -> None:
        pass

    def whole(self, final: FinalEvent) -> dict[str, Any]:
        self.result = self.shaper.whole(final, self.answer.whole(final))
        return self.result

    def conversation(self) -> list[dict[str, Any]]:
        return responses_api.conversation_after(self.parsed, self.shaper.items)


class MessagesAdapter:

    def __init__(self, parsed: Parsed, model: str) -> None:
        self.shaper = anthropic_api.Shaper(parsed, model)
        self.answer = Answer(parsed.tools)

    def opening(self, prompt_tokens: int) -> list[str]:
        return self.shaper.start(prompt_tokens, 0)

    def tokens(self, ev: TokenEvent) -> list[str]:
        return self.shaper.deltas(self.answer.feed(ev))

    def closing(self, final: FinalEvent) -> list[str]:
        deltas, outcome = self.answer.finish(final)
        return self.shaper.deltas(deltas) + self.shaper.end(final, outcome)

    def failed(self, message: str) -> list[str]:
        return self.shaper.failed(message)

    def note(self, ev: TokenEvent) -> None:
        pass

    def whole(self, final: FinalEvent) -> dict[str, Any]:
        return self.shaper.whole(final, self.answer.whole(final))


__all__ = ["ChatAdapter", "ResponsesAdapter", "MessagesAdapter", "Outcome"]


class OllamaAdapter:
    """NDJSON lines for /api/chat and /api/generate, driven by the server like the other
    adapters. Tool calls come whole, in one line once the answer is
    complete, as Ollama sends them."""

    media_type = "application/x-ndjson"

    def __init__(self, parsed: Parsed, model: str, piece, load_ms: float = 0.0) -> None:
        self.parsed, self.model, self.piece, self.load_ms = parsed, model, piece, load_ms
        self.chat = parsed.extra["ollama"] == "chat"
        self.think = parsed.extra["think"] is not False
        self.answer = Answer(parsed.tools)
        self.entries: list[dict[str, Any]] = []  # log-probabilities not sent yet
        self.all_entries: list[dict[str, Any]] = []

    def note(self, ev: TokenEvent) -> None:
        if self.parsed.logprobs is not None and ev.logprob is not None:
            entry = token_logprob(ev, self.piece)
            self.entries.append(entry)
            self.all_entries.append(entry)

    def _with_logprobs(self, obj: dict[str, Any]) -> dict[str, Any]:
        if self.entries:
            obj["logprobs"], self.entries = self.entries, []
        return obj

    def _line(self, obj: dict[str, Any]) -> str:
        return json.dumps(obj, ensure_ascii=False, separators=(",", ":")) + "\n"

    def _part(self, content: str = "", thinking: str = "", calls=None) -> dict[str, Any]:
        return ollama_api.part(self.model, self.chat, content, thinking, calls)

    def _lines(self, deltas) -> list[str]:
        out = []
        for d in deltas:
            if d.kind == "content" and d.text:
                out.append(self._line(self._with_logprobs(self._part(d.text))))
            elif d.kind == "reasoning" and d.text and self.think:
                out.append(self._line(self._part(thinking=d.text)))
        return out  # calls are sent whole at the end

    def _final(self, obj: dict[str, Any], final: FinalEvent, reason: str) -> dict[str, Any]:
        return ollama_api.finish(obj, final, reason, self.load_ms)

    def opening(self, prompt_tokens: int) -> list[str]:
        return []

    def tokens(self, ev: TokenEvent) -> list[str]:
        self.note(ev)
        return self._lines(self.answer.feed(ev))

    def closing(self, final: FinalEvent) -> list[str]:
        deltas, outcome = self.answer.finish(final)
        out = self._lines(deltas)
        if outcome.calls:
            out.append(self._line(self._part(calls=outcome.calls)))
        return out + [self._line(self._with_logprobs(self._final(self._part(), final, outcome.finish_reason)))]

    def failed(self, message: str) -> list[str]:
        return [self._line({"error": message})]

    def whole(self, final: FinalEvent) -> dict[str, Any]:
        outcome = self.answer.whole(final)
        part = self._part(outcome.content, final.reasoning if self.think else "", outcome.calls)
        if self.all_entries:
            part["logprobs"] = self.all_entries
        return self._final(part, final, outcome.finish_reason)

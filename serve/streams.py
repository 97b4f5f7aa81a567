"""One adapter per API between the engine's events and the API's answer: the server drives
them all the same way (`opening`, `tokens`, `closing` for a stream, `whole` for a whole
answer), and each says its answer in its own shape (serve/openai_api.py,
serve/responses_api.py, serve/anthropic_api.py)."""

from __future__ import annotations

import json
from typing import Any

from tallow.runtime.types import FinalEvent, TokenEvent

from . import anthropic_api, openai_api, responses_api
from .answer import Answer, Outcome
from .openai_api import Parsed


def _data(obj: dict[str, Any]) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


class ChatAdapter:
    """Chat and text completions: `data:` chunks, then `data: [DONE]`."""

    error_shape = "openai"

    def __init__(self, parsed: Parsed, model: str, piece, fingerprint: str) -> None:
        self.parsed = parsed
        self.shaper = openai_api.Shaper(parsed, model, piece, fingerprint)
        self.answer = Answer(parsed.tools)

    def opening(self, prompt_tokens: int) -> list[str]:
        return [_data(self.shaper.chunk(first=True))] if self.shaper.chat else []

    def tokens(self, ev: TokenEvent) -> list[str]:
        entry = self.shaper.note(ev)
        if not self.shaper.chat:
            return [_data(self.shaper.chunk(ev.text, entry=entry))] if ev.text or entry is not None else []
        return [_data(c) for c in self.shaper.deltas(self.answer.feed(ev), entry)]

    def closing(self, final: FinalEvent) -> list[str]:
        deltas, outcome = self.answer.finish(final)
        if not self.shaper.chat:
            out = [_data(self.shaper.chunk(final.tail))] if final.tail else []
            out.append(_data(self.shaper.chunk(finish=final.finish_reason)))
        else:
            out = [_data(c) for c in self.shaper.deltas(deltas)]
            out.append(_data(self.shaper.chunk(finish=outcome.finish_reason, error=outcome.error)))
        if self.parsed.include_usage:
            out.append(_data(self.shaper.usage_chunk(final)))
        return out + ["data: [DONE]\n\n"]

    def failed(self, message: str) -> list[str]:
        return [_data(openai_api.APIError(message, 500, kind="server_error").body())]

    def note(self, ev: TokenEvent) -> None:
        self.shaper.note(ev)

    def whole(self, final: FinalEvent) -> dict[str, Any]:
        return self.shaper.whole(final, self.answer.whole(final))


class ResponsesAdapter:
    error_shape = "openai"

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
    error_shape = "anthropic"

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

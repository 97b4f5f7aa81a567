"""Anthropic's Messages API (`/v1/messages`, `/v1/messages/count_tokens`).

Content blocks in (text, tool_use, tool_result; earlier thinking blocks are not shown to the
model again), content blocks out (thinking, text, tool_use), streamed as Anthropic's event
sequence. Errors on these routes take Anthropic's shape (`anthropic_error`).
"""

from __future__ import annotations

import json
import secrets
from typing import Any

from tallow.runtime.answer import Outcome
from tallow.runtime.intake import Parsed
from tallow.runtime.media import MARKER
from tallow.runtime.types import FinalEvent
from tallow.wire.fields import (
    APIError,
    body_names,
    check_fields,
    draft_field,
    field_names,
    flag,
    joined_text,
    number,
    requested_tokens,
    sampling,
    stops,
    tool_choice,
    tool_list,
)
from tallow.wire.media_parts import Fetch, anthropic_block
from tallow.wire.request import Limits, generation

FIELDS = field_names("anthropic") | body_names("anthropic") | {"model", "messages", "system", "stream"}
COUNT_FIELDS = body_names("anthropic", "tools", "reasoning") | {"model", "messages", "system"}
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
               404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error", 503: "overloaded_error"}


def anthropic_error(err: APIError) -> dict[str, Any]:
    return {"type": "error", "error": {"type": ERROR_TYPES.get(err.status, "api_error"), "message": err.message}}


def new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(12)}"


def _text_blocks(value: Any, where: str) -> str:
    return joined_text(value, where, where, noun="blocks")


def messages_of(body: dict[str, Any], fetch: Fetch | None = None) -> list[dict[str, Any]]:
    """Anthropic messages (and system) as tallow's messages."""
    out: list[dict[str, Any]] = []
    if body.get("system") is not None:
        system = _text_blocks(body["system"], "system")
        if system:
            out.append({"role": "system", "content": system})
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise APIError("'messages' must be a non-empty list", param="messages")
    names: dict[str, str] = {}
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(m, dict) or m.get("role") not in ("user", "assistant"):
            raise APIError(f"{where} needs a 'role' of user or assistant", param="messages")
        content = m.get("content")
        if isinstance(content, str):
            out.append({"role": m["role"], "content": content})
            continue
        if not isinstance(content, list):
            raise APIError(f"{where}.content must be a string or a list of blocks", param="messages")
        text, calls, media, thoughts = [], [], [], []
        for j, b in enumerate(content):
            kind = b.get("type") if isinstance(b, dict) else None
            bw = f"{where}.content[{j}]"
            if kind == "text" and isinstance(b.get("text"), str):
                text.append(b["text"])
            elif kind == "image" and m["role"] == "user":
                media.append(anthropic_block(b, bw, "messages", fetch))
                text.append(MARKER)
            elif kind == "tool_use" and m["role"] == "assistant":
                if not isinstance(b.get("id"), str) or not isinstance(b.get("name"), str) or not isinstance(b.get("input", {}), dict):
                    raise APIError(f"{bw}: a tool_use block needs an id, a name and an input object", param="messages")
                names[b["id"]] = b["name"]
                calls.append({"id": b["id"], "name": b["name"], "arguments": json.dumps(b.get("input", {}), ensure_ascii=False)})
            elif kind == "tool_result" and m["role"] == "user":
                if text:  # text before a result stays before it
                    out.append({"role": "user", "content": "".join(text), **({"media": media} if media else {})})
                    text, media = [], []
                ref = b.get("tool_use_id")
                if not isinstance(ref, str):
                    raise APIError(f"{bw}: a tool_result block needs a tool_use_id", param="messages")
                result = _text_blocks(b.get("content", ""), f"{bw}.content")
                if b.get("is_error") is True:
                    result = f"Error: {result}"
                out.append({"role": "tool", "tool_call_id": ref, "name": names.get(ref), "content": result})
            elif kind == "thinking" and m["role"] == "assistant":
                if not isinstance(b.get("thinking"), str):
                    raise APIError(f"{bw}: a thinking block needs its 'thinking' text", param="messages")
                thoughts.append(b["thinking"])  # to the template as reasoning_content, where it has a place for it
            elif kind == "redacted_thinking" and m["role"] == "assistant":
                continue  # encrypted by another provider: nothing a local model can read
            else:
                raise APIError(f"{bw}: blocks of type {kind!r} are not supported in a {m['role']} message",
                               param="messages")
        if text or calls or thoughts or not content:
            msg: dict[str, Any] = {"role": m["role"], "content": "".join(text)}
            if thoughts:
                msg["reasoning_content"] = "".join(thoughts)
            if media:
                msg["media"] = media
            if calls:
                msg["tool_calls"] = calls
            out.append(msg)
    return out


def _thinking(body: dict[str, Any], max_tokens: int | None, default: int | None = None) -> tuple[bool, int | None]:
    """(whether thinking blocks are shown, the reasoning budget): enabled, its budget_tokens;
    disabled, no thinking (a budget of 0); absent, the server's default, not shown."""
    t = body.get("thinking")
    if t is None:
        return False, default
    if not isinstance(t, dict) or t.get("type") not in ("enabled", "disabled"):
        raise APIError("'thinking' must be {\"type\": \"enabled\", \"budget_tokens\": N} or {\"type\": \"disabled\"}",
                       param="thinking")
    if t["type"] == "enabled":
        budget = number(t, "budget_tokens", 1024, 2**31, None, integer=True)
        if budget is None or (max_tokens is not None and budget >= max_tokens):
            raise APIError("'thinking.budget_tokens' must be at least 1024 and less than max_tokens", param="thinking")
        return True, budget
    return False, 0


def parse(body: dict[str, Any], limits: Limits) -> Parsed:
    check_fields(body, FIELDS, "/v1/messages")
    limits.check_model(body.get("model"))
    requested = requested_tokens(body, "anthropic")
    if requested is None:
        raise APIError("'max_tokens' is required", param="max_tokens")
    thinking, budget = _thinking(body, requested, limits.reasoning_budget)
    tools = tool_list(body["tools"], "tools", "anthropic") if body.get("tools") is not None else ()
    choice = tool_choice(tools, body.get("tool_choice"), True, limits.tool_format, "anthropic")
    draft = draft_field(body)
    messages = messages_of(body, limits.fetch)
    return Parsed(messages=messages, prompt=None, max_tokens=limits.clamp(requested), generation=generation(messages),
                  stop=stops(body.get("stop_sequences"), "stop_sequences", 16, limits.stop), sampling=sampling(body, limits.sampling, "anthropic"),
                  stream=flag(body, "stream"), include_usage=True, logprobs=None, json_format=False, schema=None,
                  draft=draft, tools=choice, extra={"thinking": thinking}, reasoning_budget=budget)


def parse_count(body: dict[str, Any], limits: Limits) -> Parsed:
    check_fields(body, COUNT_FIELDS, "/v1/messages/count_tokens")
    limits.check_model(body.get("model"))
    _thinking(body, None)
    tools = tool_list(body["tools"], "tools", "anthropic") if body.get("tools") is not None else ()
    choice = tool_choice(tools, body.get("tool_choice"), True, limits.tool_format, "anthropic")
    return Parsed(messages=messages_of(body, limits.fetch), prompt=None, max_tokens=1, stop=(), sampling=sampling({}),
                  stream=False, include_usage=False, logprobs=None, json_format=False, schema=None, tools=choice)


def _usage(final: FinalEvent | None, prompt_tokens: int = 0, cached: int = 0) -> dict[str, Any]:
    if final is not None:
        prompt_tokens, cached = final.usage.prompt_tokens or 0, final.usage.cached_tokens or 0
    return {"input_tokens": prompt_tokens - cached, "output_tokens": final.usage.completion_tokens if final else 0,
            "cache_read_input_tokens": cached, "cache_creation_input_tokens": 0}


def _stop_reason(final: FinalEvent, outcome: Outcome) -> str:
    if final.finish_reason == "length":  # calls completed before the cut come with it (runtime/answer.py)
        return "max_tokens"
    if outcome.calls:
        return "tool_use"
    return "stop_sequence" if final.stop_sequence else "end_turn"


class Shaper:
    def __init__(self, parsed: Parsed, model: str) -> None:
        self.id = new_id("msg")
        self.model = model
        self.thinking = parsed.extra.get("thinking", False)
        self.blocks: list[dict[str, Any]] = []
        self.open: dict[str, Any] | None = None

    def _message(self, content: list, final: FinalEvent | None, outcome: Outcome | None) -> dict[str, Any]:
        out = {"id": self.id, "type": "message", "role": "assistant", "model": self.model, "content": content,
               "stop_reason": _stop_reason(final, outcome) if final and outcome else None,
               "stop_sequence": final.stop_sequence if final else None, "usage": _usage(final)}
        if outcome is not None and outcome.error:
            out["tool_call_error"] = outcome.error  # tallow's extension
        return out

    def whole(self, final: FinalEvent, outcome: Outcome) -> dict[str, Any]:
        content: list[dict[str, Any]] = []
        if outcome.reasoning and self.thinking:
            content.append({"type": "thinking", "thinking": outcome.reasoning, "signature": ""})
        if outcome.content.strip() or not outcome.calls:
            content.append({"type": "text", "text": outcome.content})
        for cid, name, args in outcome.calls:
            content.append({"type": "tool_use", "id": cid.replace("call_", "toolu_", 1), "name": name,
                            "input": json.loads(args)})
        return self._message(content, final, outcome)

    # -- streaming -------------------------------------------------------------------------
    @staticmethod
    def event(kind: str, **fields) -> str:
        return f"event: {kind}\ndata: {json.dumps({'type': kind, **fields}, ensure_ascii=False)}\n\n"

    def start(self, prompt_tokens: int, cached: int) -> list[str]:
        msg = self._message([], None, None)
        msg["usage"] = _usage(None, prompt_tokens, cached)
        return [self.event("message_start", message=msg)]

    def _begin(self, block: dict[str, Any]) -> list[str]:
        out = self._close()
        self.open = block
        self.blocks.append(block)
        return out + [self.event("content_block_start", index=len(self.blocks) - 1, content_block=block)]

    def _close(self) -> list[str]:
        if self.open is None:
            return []
        block, self.open = self.open, None
        n = len(self.blocks) - 1
        out = []
        if block["type"] == "thinking":
            out.append(self.event("content_block_delta", index=n, delta={"type": "signature_delta", "signature": ""}))
        return out + [self.event("content_block_stop", index=n)]

    def deltas(self, deltas) -> list[str]:
        out: list[str] = []
        for d in deltas:
            kind = self.open["type"] if self.open else None
            n = len(self.blocks) - 1
            if d.kind == "reasoning":
                if not self.thinking:
                    continue
                if kind != "thinking":
                    out += self._begin({"type": "thinking", "thinking": "", "signature": ""})
                    n += 1
                out.append(self.event("content_block_delta", index=n, delta={"type": "thinking_delta", "thinking": d.text}))
            elif d.kind == "content":
                if kind != "text":
                    if not d.text.strip() and self.blocks:
                        continue
                    out += self._begin({"type": "text", "text": ""})
                    n += 1
                out.append(self.event("content_block_delta", index=n, delta={"type": "text_delta", "text": d.text}))
            elif d.kind == "call":
                out += self._begin({"type": "tool_use", "id": d.id.replace("call_", "toolu_", 1), "name": d.text,
                                    "input": {}})
            else:
                out.append(self.event("content_block_delta", index=n,
                                      delta={"type": "input_json_delta", "partial_json": d.text}))
        return out

    def end(self, final: FinalEvent, outcome: Outcome) -> list[str]:
        out = self._close()
        if not self.blocks:
            out += self._begin({"type": "text", "text": ""}) + self._close()
        delta = {"stop_reason": _stop_reason(final, outcome), "stop_sequence": final.stop_sequence}
        fields: dict[str, Any] = {"delta": delta, "usage": _usage(final)}
        if outcome.error:
            fields["tool_call_error"] = outcome.error
        return out + [self.event("message_delta", **fields), self.event("message_stop")]

    def failed(self, message: str) -> list[str]:
        return [self.event("error", error={"type": "api_error", "message": message})]
